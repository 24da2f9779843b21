"""Hugging Face `config.json` → `RopeParameters`, resolved as transformers 5.23 resolves it.

Reference: transformers 5.23.0 `modeling_rope_utils.py`, `RotaryEmbeddingConfigMixin`
(`convert_rope_params_to_dict`, `standardize_rope_params`, `validate_rope`, `_check_received_keys`)
and the init functions' reads of `config.head_dim` / `hidden_size // num_attention_heads`.
docs/ENCODINGS.md §1.1.

Rules reproduced:
- the dict is `rope_scaling` (v4) if truthy, else `rope_parameters` (v5), else {};
- `mrope` is `default` (Qwen2VLConfig's rename; `mrope_section` is validated and reported, §8), and
  `dynamic` with a truthy `alpha` is `ntk_alpha` (HunYuan's rotary module, §14);
- top-level `rope_theta` (default 10000.0, the mixin's `default_theta`) and `partial_rotary_factor`
  only fill keys the dict lacks; `rope_type` falls back to the legacy `type`, then "default";
- llama3/yarn/longrope: a top-level `original_max_position_embeddings` (Phi-3) overwrites the
  dict's value; otherwise the dict value defaults to `max_position_embeddings`. In the nested
  (per-layer) form only the default applies, as in `standardize_rope_params`;
- required keys per rope_type as `_validate_*_rope_parameters` (the registry's `config_keys`; KeyError
  there, ParameterError here);
- yarn's `truncate` is read from the top-level dict (`config.rope_parameters.get("truncate", True)`),
  so a nested config always truncates;
- the head size of a layer type is its layers' `per_layer_config` overrides on the global keys (transformers
  5's heterogeneous configs: Gemma-4 writes its full-attention head size there), `rope_layer_types` lists the
  layer types of a nested config.

Not reproduced (model-class knowledge a bare config.json does not carry): per-model `default_theta`
and field defaults of the config classes (e.g. Phi3Config's default original length 4096), and
Llama's default rope ignoring `partial_rotary_factor` (here it is honoured, as GPT-NeoX does).
Where the text model's sub-config, heads and head size are read, and each family's own spellings, is the table of
`posenc.models.architectures`.
"""

from collections.abc import Mapping
from typing import Any

from posenc.models.architectures import (
    HEAD_SIZE_INPUTS,
    family,
    head_size,
    model_section,
    model_type_of,
    positive_int,
    with_family_spellings,
)
from posenc.models.bounds import DEFAULT_ROPE_THETA
from posenc.models.errors import ParameterError
from posenc.models.mrope import check_mrope_section, check_xdrope_section
from posenc.models.rope_params import RopeParameters, make_rope_parameters
from posenc.models.rope_types import DEFAULT_ROPE_TYPE, ROPE_TYPES, resolve_variant, rope_type_spec


def _with_class_spellings(cfg: Mapping[str, Any], model_type: str | None) -> Mapping[str, Any]:
    """`cfg` with the keys its model class renames read under the resolver's names, and a GPT-J-style `rotary_dim`
    (the rotated channels of each head) as the partial_rotary_factor that gives it."""
    out = with_family_spellings(cfg, model_type)
    rotary_dim = cfg.get("rotary_dim")
    if family(model_type).rotary_dim and isinstance(rotary_dim, int) and positive_int(rotary_dim) \
            and out.get("partial_rotary_factor") is None:
        head_dim = head_size(out, model_type)
        if rotary_dim > head_dim or int(head_dim * (rotary_dim / head_dim)) != rotary_dim:
            raise ParameterError("rotary_dim", f"must be an even number of channels <= head_dim, got {rotary_dim!r}")
        out = {**out, "partial_rotary_factor": rotary_dim / head_dim}
    return out


def layer_config(config: Mapping[str, Any], layer_type: str | None) -> Mapping[str, Any]:
    """`config` as the rotary module of `layer_type`'s layers sees it: the global keys with that layer type's
    `per_layer_config` overrides of the head size's inputs on top, as transformers 5's
    `config.per_layer_config[layer_type]` builds it (integrations/heterogeneity/configuration_utils.py,
    `_PerLayerConfigView.__getitem__`; Gemma-4 writes its full-attention head size there).

    `per_layer_config`: {layer index (a decimal string, zero-padded as `to_dict` writes it): {attribute: value}},
    sparse (layers without overrides are left out). Every layer of the type must carry the same head-size overrides
    (transformers: ValueError, here ParameterError); other overrides (a sliding window per layer) are not the
    rotary module's. `layer_type` None, or absent from `layer_types`: `config`. One pass over the entries.
    """
    per_layer = config.get("per_layer_config")
    if per_layer is None and layer_type == "full_attention" and positive_int(config.get("global_head_dim")):
        # Gemma4TextConfig builds per_layer_config from global_head_dim only when the config has none
        return {**config, "head_dim": config["global_head_dim"]}
    layer_types = config.get("layer_types")
    if per_layer is None or layer_type is None or not isinstance(layer_types, list) or layer_type not in layer_types:
        return config
    if not isinstance(per_layer, Mapping):
        raise ParameterError("per_layer_config", "must be an object of layer index -> overrides")
    overrides: dict[int, dict[str, Any]] = {}
    for key, value in per_layer.items():
        index = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10 else -1
        if not 0 <= index < len(layer_types):
            raise ParameterError("per_layer_config", f"keys must be layer indices in [0, {len(layer_types)}), "
                                                     f"got {str(key)[:20]!r}")
        if not isinstance(value, Mapping):
            raise ParameterError("per_layer_config", f"the overrides of layer {index} must be an object")
        if layer_types[index] == layer_type:
            overrides[index] = {k: v for k, v in value.items() if k in HEAD_SIZE_INPUTS}
    first = overrides.get(layer_types.index(layer_type), {})
    for index, kind in enumerate(layer_types):
        if kind == layer_type and overrides.get(index, {}) != first:
            raise ParameterError("per_layer_config", f"layer type {layer_type!r} is not homogeneous across layers "
                                                     f"(layer {index} differs)")
    return {**config, **first}


# The keys a flat rope dict holds (an object under one of them is a malformed value, not a layer type).
_ROPE_FIELDS = frozenset({"type", "rope_type", "rope_theta", "partial_rotary_factor", "mrope_section",
                          "mrope_interleaved", "alpha"}).union(*(spec.reads | spec.config_keys
                                                                  for spec in ROPE_TYPES.values()))


def _nested_keys(rope: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """The keys of a per-layer-type rope dict: those named in the config's layer types (a None entry is a NoPE layer
    type), and any whose value is an object (DeepSeek-V4's `main` and `compress`, which its `layer_types` do not
    name)."""
    labels = config.get("_rope_type_labels") or config.get("layer_types") or ()
    named = {label for label in labels if isinstance(label, str)} if isinstance(labels, list | tuple) else set()
    return [key for key, value in rope.items()
            if key in named or (isinstance(value, Mapping) and key not in _ROPE_FIELDS)]


def rope_layer_types(config: Mapping[str, Any], section: str | None = None) -> tuple[str, ...]:
    """The layer types a per-layer-type `rope_parameters` gives a RoPE each (Gemma 3 and 4 as transformers 5
    writes them: `("full_attention", "sliding_attention")`), sorted as transformers' rotary modules take them
    (`sorted(set(config.layer_types))`); () for one RoPE for all layers. A `None` entry (a NoPE layer type) is
    left out; so is anything that does not parse (the resolver names what is wrong)."""
    if not isinstance(config, Mapping):
        return ()
    try:
        _, cfg = model_section(config, section)
    except ParameterError:
        return ()
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rope, Mapping):
        return ()
    return tuple(sorted(key for key in _nested_keys(rope, cfg) if rope[key] is not None))


_NAMED = 20  # layer types an error message names (a config may list thousands)


def _select_entry(
    rope: Mapping[str, Any], config: Mapping[str, Any], layer_type: str | None
) -> tuple[dict[str, Any], bool]:
    """(the RoPE dict that applies, whether the config is nested per layer type)."""
    nested_keys = _nested_keys(rope, config)
    if not nested_keys:
        if layer_type is not None:
            raise ParameterError("layer_type", "this config has one RoPE for all layers; omit layer_type")
        return dict(rope), False
    if layer_type not in set(nested_keys):
        names = sorted(nested_keys)
        more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
        raise ParameterError("layer_type", f"this config has per-layer RoPE; choose one of "
                                           f"{', '.join(names[:_NAMED])}{more}")
    entry = rope[layer_type]
    if entry is None:
        raise ParameterError("layer_type", f"layer type {layer_type!r} has no RoPE (NoPE layer)")
    if not isinstance(entry, Mapping):
        raise ParameterError("rope_parameters", f"entry for {layer_type!r} must be an object")
    return dict(entry), True


def _check_required(entry: Mapping[str, Any]) -> str:
    """rope_type after validation; ParameterError naming missing keys (transformers: KeyError)."""
    rope_type = entry["rope_type"]
    missing = sorted(rope_type_spec(rope_type).config_keys - set(entry))
    if missing:
        raise ParameterError(
            ", ".join(missing), f"missing in rope_parameters, required for rope_type {rope_type!r}"
        )
    return str(rope_type)


def rope_parameters_from_config(
    config: Mapping[str, Any], *, layer_type: str | None = None, section: str | None = None
) -> tuple[RopeParameters, dict[str, Any]]:
    """Resolve a Hugging Face `config.json` object to RopeParameters (+ info).

    `layer_type` picks one entry of a per-layer (nested) `rope_parameters`, e.g. Gemma's
    "full_attention" / "sliding_attention"; it is required for such configs and refused otherwise. `section`: the
    dotted path of another model of a composite config than its text model (`audio_config`).
    info: `max_position_embeddings` (None if absent), `rope_source` ("rope_scaling",
    "rope_parameters" or "none"), `config_section` (the text model's sub-config path, "" for the config itself),
    `layer_type`, `model_type`, `layout` (the family's channel pairing, `posenc.models.architectures`).
    """
    if not isinstance(config, Mapping):
        raise ParameterError("config", "config.json must be a JSON object")
    chosen = section
    section, cfg = model_section(config, section)
    # a model chosen by path is its own family; the text model found by the search may inherit its wrapper's
    model_type = str(cfg.get("model_type") or "") or None if chosen else model_type_of(config, cfg)
    if not family(model_type).rope:
        raise ParameterError("model_type",
                             f"{model_type} has no rotary positions in its text model (learned, ALiBi or none)")
    cfg = _with_class_spellings(cfg, model_type)
    source = next((key for key in ("rope_scaling", "rope_parameters") if cfg.get(key)), "none")
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise ParameterError(source, "must be a JSON object")
    entry, nested = _select_entry(rope, cfg, layer_type)

    entry.setdefault("rope_theta", cfg.get("rope_theta", DEFAULT_ROPE_THETA))
    if cfg.get("partial_rotary_factor") is not None:
        entry.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
    entry.setdefault("rope_type", entry.get("type", DEFAULT_ROPE_TYPE))
    if not isinstance(entry["rope_type"], str):
        raise ParameterError("rope_type", f"must be a string, got {entry['rope_type']!r}")
    # Qwen2-VL's `mrope` is the default; HunYuan's `dynamic` with a fixed alpha is NTK-alpha
    entry["rope_type"] = resolve_variant(entry["rope_type"], alpha=entry.get("alpha"))
    max_pos = cfg.get("max_position_embeddings")
    spec = ROPE_TYPES.get(entry["rope_type"])
    if spec is not None and spec.original_from_max:
        if not nested and cfg.get("original_max_position_embeddings") is not None:
            entry["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
        elif max_pos is not None:
            entry.setdefault("original_max_position_embeddings", max_pos)
    rope_type = _check_required(entry)
    reads = ROPE_TYPES[rope_type].reads
    # the rope dict's values of the fields the type reads; max_position_embeddings is the model's (top
    # level), truncate is read from the top-level dict (transformers tests its truthiness)
    scaling = {name: entry.get(name) for name in sorted(reads - {"max_position_embeddings", "truncate"})}
    if "truncate" in reads:
        scaling["truncate"] = bool(rope.get("truncate", True))

    params = make_rope_parameters(
        head_dim=head_size(layer_config(cfg, layer_type), model_type),
        partial_rotary_factor=entry.get("partial_rotary_factor"),
        rope_theta=entry["rope_theta"] if entry["rope_theta"] is not None else _null_theta(),
        rope_type=rope_type,
        max_position_embeddings=max_pos,
        **scaling,
    )
    info = {
        "max_position_embeddings": max_pos,
        "rope_source": source,
        "config_section": section,
        "layer_type": layer_type,
        "model_type": model_type,
        "layout": family(model_type).layout,
        **_mrope_info(model_type, entry, params),
    }
    return params, info


def _mrope_info(model_type: str | None, entry: Mapping[str, Any], params: RopeParameters) -> dict[str, Any]:
    """`mrope_section`, `mrope_order` and `mrope_interleaved` of an M-RoPE config (validated), else {}: the config's
    sections, else the ones its family's rotary module defaults to; ordered as the family's module orders them, or
    interleaved where the config's `mrope_interleaved` says so."""
    known = family(model_type)
    section = entry.get("mrope_section", known.mrope_section)
    if section is None:
        return {}
    if not isinstance(section, list | tuple):
        raise ParameterError("mrope_section", f"must be a list of three integers, got {repr(section)[:40]}")
    if known.xdrope:
        return {"mrope_section": list(check_xdrope_section(section, params.n_frequencies)), "mrope_order": "xdrope",
                "mrope_interleaved": False}
    order = "interleaved" if entry.get("mrope_interleaved") else known.mrope_order
    return {"mrope_section": list(check_mrope_section(section, params.n_frequencies, order)), "mrope_order": order,
            "mrope_interleaved": order == "interleaved"}


def _null_theta() -> float:
    raise ParameterError("rope_theta", "is null in config.json; give a number or leave it out")
