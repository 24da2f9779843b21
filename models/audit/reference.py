"""The reference an audit compares a file with: a named preset, a config.json, the catalogue's presets whose
architecture and sizes match the file, or none (the file is then checked for internal consistency only).

Every reference resolves through the resolver an uploaded config.json goes through
(`posenc.models.rope_config.rope_parameters_from_config`), so `--preset llama-3.1-8b` and that model's
config.json give the same golden tables; its sizes are read where the table of architectures says each family
states them (`posenc.models.architectures`). A named reference the audit cannot judge by is refused (`applicable`),
never replaced by the file's internal consistency.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from posenc.models.architectures import (
    CONTEXT_KEYS,
    MLA_KEYS,
    family,
    first_int,
    heads_keys,
    hidden_keys,
    kv_heads_keys,
    model_section,
    model_type_of,
    rope_switched_off,
    with_family_spellings,
)
from posenc.models.audit.found import Found
from posenc.models.audit.llama_cpp import MLA_HEAD, MLA_ONE_KV_HEAD
from posenc.models.errors import ParameterError
from posenc.models.presets import Preset, catalogue, find_preset
from posenc.models.rope_config import layer_config, rope_layer_types, rope_parameters_from_config
from posenc.models.rope_params import RopeParameters, make_rope_parameters

# config.json model_type → the architecture name GGUF files carry (`general.architecture`) where they differ
GGUF_ARCHITECTURES: Mapping[str, str] = {
    "mistral": "llama", "mixtral": "llama", "qwen2_vl": "qwen2vl", "qwen2_5_vl": "qwen2vl", "gemma3_text": "gemma3",
    "deepseek_v2": "deepseek2", "deepseek_v3": "deepseek2", "gpt_neox": "gptneox", "gpt_oss": "gpt-oss",
    "qwen3_vl": "qwen3vl", "gemma4_text": "gemma4", "hunyuan_v1_dense": "hunyuan-dense", "deepseek_v32": "deepseek32",
}
# the sizes a catalogue match compares (a file's value against the preset's), strictest first
MATCHED_SIZES = ("hidden_size", "num_heads", "head_dim")

Kind = Literal["preset", "config", "catalogue", "none"]


@dataclass(frozen=True)
class Mla:
    """The head of a model with multi-head latent attention: `nope` channels left unrotated and `rope` rotated ones
    (its rotary module's head_dim) make a q/k head; k and v come from a latent of `kv_lora_rank` channels (None: the
    config does not say)."""

    nope: int
    rope: int
    kv_lora_rank: int | None = None

    @property
    def head(self) -> int:
        """The q/k head: qk_nope_head_dim + qk_rope_head_dim."""
        return self.nope + self.rope

    @property
    def latent(self) -> int | None:
        """The KV latent and the rotated part: kv_lora_rank + qk_rope_head_dim (llama.cpp's compressed key_length)."""
        return None if self.kv_lora_rank is None else self.kv_lora_rank + self.rope

    def document(self) -> dict[str, int]:
        out = {"qk_nope_head_dim": self.nope, "qk_rope_head_dim": self.rope}
        return out if self.kv_lora_rank is None else {**out, "kv_lora_rank": self.kv_lora_rank}


@dataclass(frozen=True)
class Reference:
    """What the file should say. `params` None: no RoPE reference (internal consistency only)."""

    kind: Kind
    label: str
    params: RopeParameters | None = None
    context_length: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    architecture: str | None = None
    theta_swa: float | None = None
    sections: tuple[int, ...] | None = None
    interleaved: bool = False
    learned_positions: int | None = None
    alibi_heads: int | None = None
    alibi_mode: str | None = None  # an ALiBi model's bias form (a preset's serving mode): slopes are judged
    fits: tuple[str, ...] = ()  # a guess by shape: every catalogue preset that fits the file, the chosen one first
    problem: str | None = None  # why a named config gives no RoPE reference
    layer_type: str | None = None  # the layer type whose RoPE `params` is (a model with RoPE per layer type)
    # a model with RoPE per layer type: one reference per layer type, each judged apart; this one's params and
    # head_dim are those of its main layers (the ones GGUF's keys without _swa describe), for a match by shape
    layers: tuple[Reference, ...] = ()
    mla: Mla | None = None  # a model with multi-head latent attention: its head's sizes
    nope: bool = False  # the model's attention has no positions (its config switches RoPE off)

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "label": self.label}
        if self.layer_type is not None:
            out["layer_type"] = self.layer_type
        if self.layers:
            out["layer_types"] = [layer.layer_type for layer in self.layers]
        elif self.params is not None:
            out["rope"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(self.params).items()
                           if v is not None}
        for name in ("context_length", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "architecture",
                     "theta_swa", "learned_positions", "alibi_heads", "alibi_mode", "problem"):
            if name == "problem" and self.nope:
                continue
            if getattr(self, name) is not None and not (self.layers and name == "head_dim"):
                out[name] = getattr(self, name)
        if self.sections is not None:
            out["sections"] = list(self.sections)
        if self.mla is not None:
            out["mla"] = self.mla.document()
        if self.guessed:
            out["chosen_by"] = "shape"
            out["fits"] = list(self.fits)
        return out

    @property
    def guessed(self) -> bool:
        """Chosen by the file's shape alone (no --preset, no --config): no model's word on the file."""
        return self.kind == "catalogue"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def text_section(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text model's part of a config.json, found as the RoPE resolver finds it (`posenc.models.architectures`)."""
    return model_section(config)[1]


@dataclass(frozen=True)
class Sizes:
    """A config.json's text model as the table of architectures reads it (`posenc.models.architectures`: its
    sub-config, then the family's own spellings before the generic keys)."""

    model_type: str | None
    hidden_size: int | None
    num_heads: int | None
    num_kv_heads: int | None
    context_length: int | None
    mla: Mla | None


def model_sizes(config: Mapping[str, Any], layer_type: str | None = None) -> Sizes:
    """The sizes of the text model `config` describes, read through the table of architectures: one reading for the
    reference and for a config.json audited (`posenc.service.audit.config_reader`). The MLA head of `layer_type`'s
    layers where its `per_layer_config` gives them their own."""
    cfg = text_section(config)
    model_type = model_type_of(config, cfg)
    cfg = with_family_spellings(cfg, model_type)
    nope, rope, rank = (first_int(layer_config(cfg, layer_type), (key,)) for key in MLA_KEYS)
    return Sizes(model_type, first_int(cfg, hidden_keys(model_type)), first_int(cfg, heads_keys(model_type)),
                 first_int(cfg, kv_heads_keys(model_type)), first_int(cfg, CONTEXT_KEYS),
                 Mla(nope, rope, rank) if nope is not None and rope is not None else None)


def expected_sizes(ref: Reference, found: Found) -> dict[str, tuple[int | None, str]]:
    """What `ref` expects of each size `found` states: {fact name: (value, why a difference matters)}, the value None
    where it is not judged. The reference's own sizes, but in a GGUF of a model with multi-head latent attention
    as llama.cpp's converters write one (`llama_cpp.MLA_HEAD`): attention.key_length is the q/k head (nope + rope
    channels) or, in the compressed layout, attention.key_length_mla is, attention.key_length the KV latent's
    (kv_lora_rank + rope) and, for the architectures whose converters say so, there is one KV head."""
    out: dict[str, tuple[int | None, str]] = {
        name: (getattr(ref, name), f"{name} differs from the model's")
        for name in ("num_heads", "num_kv_heads", "head_dim", "hidden_size")}
    mla = ref.mla
    if mla is None or found.source != "gguf":
        return out
    head = (f"the q/k head is qk_nope_head_dim + qk_rope_head_dim = {mla.nope} + {mla.rope} = {mla.head} channels, "
            f"{mla.rope} of them rotated")
    if found.key_length_mla is None:
        out["head_dim"] = (mla.head, f"attention.key_length: {head} ({MLA_HEAD.source})")
        return out
    out["key_length_mla"] = (mla.head, f"attention.key_length_mla: {head} ({MLA_HEAD.source})")
    out["head_dim"] = (mla.latent, f"attention.key_length in the compressed layout: the KV latent and the rotated "
                                   f"part, kv_lora_rank + qk_rope_head_dim = {mla.kv_lora_rank} + {mla.rope}")
    one = MLA_ONE_KV_HEAD.get(found.architecture or "")
    out["num_kv_heads"] = (1, f"the compressed layout has one KV head, the latent every head shares ({one})") \
        if one is not None else (None, "")
    return out


def _swa_theta(cfg: Mapping[str, Any]) -> float | None:
    """The base of sliding-window layers where a config with one RoPE for all layers states it apart: Gemma-3's
    rope_local_base_freq (transformers 4's spelling). A per-layer-type rope_parameters gives the sliding layers a
    reference of their own instead."""
    if isinstance(cfg.get("rope_local_base_freq"), int | float):
        return float(cfg["rope_local_base_freq"])
    return None


def _states_rope(cfg: Mapping[str, Any]) -> bool:
    """Whether a config names any RoPE setting (`rope_*`, `rotary_*`: every family's spelling starts so)."""
    return any(isinstance(key, str) and key.startswith(("rope", "rotary")) for key in cfg)


# the layer type whose RoPE GGUF states under the `_swa` keys; the model's other layers are its main ones
SLIDING_LAYER_TYPE = "sliding_attention"


def from_config(config: Mapping[str, Any], kind: Kind, label: str, serving: Mapping[str, Any] | None = None
                ) -> Reference:
    """The reference a config.json (or a preset's config and serving facts) describes: with RoPE per layer type
    (transformers 5's nested rope_parameters), one reference per layer type in `layers`, every one judged (a
    preset's serving `layer_type`, the table its routes serve, only picks the main one)."""
    serving = serving or {}
    names = rope_layer_types(config)
    if not names:
        return _from_config(config, kind, label, serving, serving.get("layer_type"))
    layers = tuple(_from_config(config, kind, label, serving, name) for name in names)
    main = next((layer for layer in layers if layer.layer_type == serving.get("layer_type")), None) or next(
        (layer for layer in layers if layer.layer_type != SLIDING_LAYER_TYPE), layers[0])
    return replace(main, layer_type=None, layers=layers)


def with_layer_type(ref: Reference, name: str) -> Reference:
    """`ref` with only its layer type `name` to judge; ParameterError (naming the model's layer types) when the model
    has no such layer type."""
    names = [layer.layer_type for layer in ref.layers]
    if name in names:
        return replace(ref, layers=tuple(layer for layer in ref.layers if layer.layer_type == name))
    shown = repr(name[:100])
    if names:
        raise ParameterError("layer_type", f"unknown layer type {shown}; the layer types of {ref.label} are "
                                           f"{', '.join(str(n) for n in names)}")
    if ref.kind == "none":
        raise ParameterError("layer_type", f"unknown layer type {shown}: no reference names layer types; give a "
                                           "preset or a config.json with rope_parameters per layer type")
    raise ParameterError("layer_type", f"unknown layer type {shown}: {ref.label} has one RoPE for all its layers "
                                       "(no layer types); leave out layer_type")


def _from_config(config: Mapping[str, Any], kind: Kind, label: str, serving: Mapping[str, Any],
                 layer_type: str | None) -> Reference:
    cfg = text_section(config)
    params: RopeParameters | None = None
    info: dict[str, Any] = {}
    problem = None
    try:
        params, info = rope_parameters_from_config(config, layer_type=layer_type)
    except ParameterError as exc:
        problem = str(exc)
    sizes = model_sizes(config, layer_type)
    model_type, heads = sizes.model_type, sizes.num_heads
    context = info.get("max_position_embeddings") or sizes.context_length
    # a learned table only where the config states no RoPE at all: a RoPE config that does not resolve is a problem
    learned = _int(cfg.get("n_positions")) if params is None and not _states_rope(cfg) else None
    return Reference(
        kind=kind, label=label, params=params, context_length=context, hidden_size=sizes.hidden_size,
        num_heads=heads, num_kv_heads=sizes.num_kv_heads, mla=sizes.mla,
        head_dim=params.head_dim if params is not None else None,
        architecture=GGUF_ARCHITECTURES.get(model_type or "", model_type),
        # per layer type, the sliding layers' base is their own reference's rope_theta
        theta_swa=_swa_theta(cfg) if layer_type is None else None,
        sections=tuple(info["mrope_section"]) if info.get("mrope_section") else None,
        # a preset's serving layout, else the pairing of the config's family (ERNIE-4.5, GLM-4, Llama 4: interleaved)
        interleaved=serving.get("layout", family(model_type).layout) == "interleaved", learned_positions=learned,
        alibi_heads=heads if serving.get("mode") is not None else None, alibi_mode=serving.get("mode"),
        problem=problem, layer_type=layer_type,
        nope=rope_switched_off(with_family_spellings(cfg, model_type), model_type))


def from_preset(name: str) -> Reference:
    """The reference of a catalogue preset (a slug or a public model id); ParameterError when unknown."""
    preset = find_preset(name)
    return _preset_reference(preset, "preset")


def _preset_reference(preset: Preset, kind: Kind) -> Reference:
    ref = from_config(preset.config, kind, f"preset {preset.name} ({preset.model_id})", preset.serving)
    if ref.params is None and ref.alibi_mode is None and ref.learned_positions is None:
        # a table of another family (sinusoidal, T5's buckets, a vision tower's): say so, not why no RoPE resolves
        return replace(ref, problem=f"its positions are {preset.family.replace('_', ' ')} ones, no RoPE, ALiBi or "
                                    "learned table to judge a file by")
    return ref


def match_catalogue(found: Found) -> Reference:
    """The catalogue presets whose architecture and sizes match the file's (each size as the preset expects the file
    to state it: `expected_sizes`): the best one (same context length first) as the reference, all of them named in
    `fits`, best first; none → kind "none"."""
    architecture, context_length = found.architecture, found.context_length
    matches: list[tuple[int, str, Reference]] = []
    for preset in catalogue().values():
        if "rope" not in preset.tables:
            continue
        ref = _preset_reference(preset, "catalogue")
        if ref.params is None:
            continue
        if architecture is not None and ref.architecture is not None and ref.architecture != architecture:
            continue
        agreeing = 0
        conflict = False
        expected = expected_sizes(ref, found)
        for name in MATCHED_SIZES:
            mine, theirs = getattr(found, name), expected[name][0]
            if mine is None or theirs is None:
                continue
            if mine != theirs:
                conflict = True
            agreeing += 1
        if conflict or agreeing + (architecture is not None and ref.architecture == architecture) < 2:
            continue
        score = 2 * (context_length is not None and ref.context_length == context_length) + agreeing
        matches.append((score, preset.name, ref))
    if not matches:
        return Reference("none", "no catalogue preset matches the file's architecture and sizes: internal "
                                 "consistency only")
    matches.sort(key=lambda match: -match[0])  # stable: the catalogue's order among equals
    fits = tuple(name for _, name, _ in matches)
    best = matches[0][2]
    return replace(best, fits=fits, layers=tuple(replace(layer, fits=fits) for layer in best.layers))


def applicable(ref: Reference) -> Reference:
    """`ref`, where the audit can judge a file by it. A named reference (a preset, a config.json) that gives no RoPE
    (or whose RoPE of a layer type does not build), no ALiBi and no learned position table is refused with a
    ParameterError saying why (`posenc audit`: exit status 2; POST /v1/audit: 422): behind a reference a user named,
    the audit never falls back to the file's internal consistency and its exit status 0."""
    if ref.kind not in ("preset", "config") or ref.alibi_mode is not None or ref.learned_positions is not None:
        return ref
    broken = next((layer for layer in (ref.layers or (ref,)) if layer.params is None), None)
    if broken is None:
        return ref
    which = f" (layer type {broken.layer_type})" if broken.layer_type else ""
    raise ParameterError(ref.kind, f"{ref.label} cannot be the audit's reference{which}: "
                                   f"{broken.problem or 'it states no RoPE, ALiBi or learned position table'}")


def from_repository_config(config: Mapping[str, Any]) -> Reference:
    """A posenc model repository's config.json (`rope`: the resolved RopeParameters fields and the layout;
    `attention`: heads; `max_position`): the reference a shipped graph is audited against."""
    rope, attention = config["rope"], config.get("attention") or {}
    if not isinstance(rope, Mapping):
        raise ParameterError("rope", "must be an object of RoPE parameters")
    names = {f.name for f in fields(RopeParameters)}
    values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in rope.items() if k in names and v is not None}
    values.pop("partial_rotary_factor", None)  # rotary_dim says it
    params = make_rope_parameters(**values)
    return Reference(kind="config", label=f"repository config of {config.get('name', 'the model')}", params=params,
                     context_length=_int(config.get("max_position")), num_heads=_int(attention.get("num_heads")),
                     num_kv_heads=_int(attention.get("num_kv_heads")), head_dim=_int(attention.get("head_dim")),
                     interleaved=rope.get("layout") == "interleaved")
