"""The hub's spellings of families whose transformers config class rewrites them on load: a config.json as the
model's makers published it (their own inference code's keys) → the form transformers 5 saves, per-layer-type
`rope_parameters` and all. Each function repeats its config class's `__post_init__` / `convert_rope_params_to_dict`
for the keys a rotary module reads, and leaves a config already in transformers 5's form as it is (what
`save_pretrained` writes reads back unchanged). `posenc.models.architectures.FAMILIES` names the function of each
family; `model_section` applies it, so the resolver, the audit's references and the presets read one form.
docs/ENCODINGS.md §1.1.
"""

from collections.abc import Mapping
from typing import Any

from posenc.models.errors import ParameterError
from posenc.models.rope_types import DEFAULT_ROPE_TYPE, ROPE_TYPES


def _number(section: Mapping[str, Any], key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ParameterError(key, f"must be a positive number, got {repr(value)[:40]}")
    return float(value)


def _int(section: Mapping[str, Any], key: str, default: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ParameterError(key, f"must be a positive integer, got {repr(value)[:40]}")
    return value


# the most layers a config.json without layer_types may spell its layer types out for (the largest released model
# has 128; the list is built from the count)
MAX_LAYERS = 4096


def _layer_count(section: Mapping[str, Any]) -> int:
    count = _int(section, "num_hidden_layers", 1)
    if count > MAX_LAYERS:
        raise ParameterError("num_hidden_layers", f"must be <= {MAX_LAYERS} where layer_types is not given, got "
                                                  f"{count}")
    return count


def _index(key: Any, count: int) -> int | None:
    """A per_layer_config key as a layer index below `count`, else None."""
    text = str(key)
    return int(text) if text.isascii() and text.isdigit() and len(text) < 10 and int(text) < count else None


def _is_nested(rope: Any, names: set[str]) -> bool:
    return isinstance(rope, Mapping) and any(isinstance(rope.get(name), Mapping) for name in names)


# Dots3NoteTextConfig (transformers 5.25, models/dots3_note/configuration_dots3_note.py): the published config.json
# names its DSA layers `full_attention` (use_dsa, default true: `indexed_attention`), states the sliding layers'
# attention under `swa_*` keys and their base as `swa_rope_theta`, and rotates qk_rope_head_dim of head_dim channels
# on each layer type (partial_rotary_factor = qk_rope_head_dim / head_dim, the layer type's own sizes).
_DOTS3_SLIDING = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1024, "kv_lora_rank": 1024,
                  "head_dim": 256, "qk_nope_head_dim": 192, "v_head_dim": 128}
_DOTS3_THETA, _DOTS3_SWA_THETA, _DOTS3_HEAD, _DOTS3_ROPE_HEAD = 80_000_000.0, 50_000.0, 256, 64


def dots3_note(section: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Dots3-Note text config in transformers 5's form: layer types renamed, the sliding layers' sizes in
    `per_layer_config`, `rope_parameters` per layer type with each one's partial_rotary_factor."""
    saved_kinds = section.get("layer_types")
    if "per_layer_config" in section and isinstance(saved_kinds, list) \
            and _is_nested(section.get("rope_parameters"), {kind for kind in saved_kinds if isinstance(kind, str)}):
        return section  # saved by transformers 5
    out = dict(section)
    use_dsa = section.get("use_dsa", None if "per_layer_config" in section else True)
    layers = _layer_count(section) if section.get("layer_types") is None else 0
    dense = "full_attention" if use_dsa is False else "indexed_attention"
    windowed = section.get("use_sliding_window", True)
    given = section.get("layer_types")
    if given is not None and not (isinstance(given, list) and all(isinstance(kind, str) for kind in given)):
        raise ParameterError("layer_types", "must be a list of layer type names")
    kinds = list(given or [
        dense if not windowed or i < 2 or i % 4 == 1 else "sliding_attention" for i in range(layers)])
    if use_dsa is not None:
        old, new = ("full_attention", "indexed_attention") if use_dsa else ("indexed_attention", "full_attention")
        kinds = [new if kind == old else kind for kind in kinds]
    out["layer_types"] = kinds
    if "per_layer_config" not in section:
        sliding = {name: _int(section, f"swa_{name}", default) for name, default in _DOTS3_SLIDING.items()}
        sliding["qk_rope_head_dim"] = _int(section, "swa_qk_rope_head_dim",
                                           max(sliding["head_dim"] - sliding["qk_nope_head_dim"], 1))
        out["per_layer_config"] = {str(i): sliding for i, kind in enumerate(kinds) if kind == "sliding_attention"}
    names = set(kinds)
    given_rope = section.get("rope_parameters") or section.get("rope_scaling")
    if given_rope is not None and not isinstance(given_rope, Mapping):
        raise ParameterError("rope_parameters", "must be a JSON object")
    rope: Mapping[str, Any]
    if isinstance(given_rope, Mapping) and _is_nested(given_rope, names):
        rope = given_rope
    elif given_rope:
        rope = {kind: dict(given_rope) for kind in names}
    else:
        theta, swa = _number(section, "rope_theta", _DOTS3_THETA), _number(section, "swa_rope_theta",
                                                                           _DOTS3_SWA_THETA)
        rope = {kind: {"rope_type": DEFAULT_ROPE_TYPE, "rope_theta": swa if kind == "sliding_attention" else theta}
                for kind in names}
    per_layer = out["per_layer_config"] if isinstance(out["per_layer_config"], Mapping) else {}
    nested = {}
    for kind in names:
        own = next((value for key, value in per_layer.items() if (index := _index(key, len(kinds))) is not None
                    and kinds[index] == kind and isinstance(value, Mapping)), {})
        rotated = _int(own, "qk_rope_head_dim", _int(section, "qk_rope_head_dim", _DOTS3_ROPE_HEAD))
        head = _int(own, "head_dim", _int(section, "head_dim", _DOTS3_HEAD))
        entry = rope.get(kind)
        nested[kind] = entry if not isinstance(entry, Mapping) else {**entry, "partial_rotary_factor": rotated / head}
    out["rope_parameters"] = nested
    out.pop("rope_scaling", None)
    return out


# DeepseekV4Config (transformers 5.25, models/deepseek_v4/configuration_deepseek_v4.py): the published config.json
# gives `compress_ratios` per layer (0: sliding-window only), `qk_rope_head_dim` of `head_dim` rotated, the main
# layers' base `rope_theta` and the compressed layers' `compress_rope_theta`, and a `rope_scaling` (YaRN) that only the
# compressed layers apply, with attention factor 1 (the reference leaves cos and sin unscaled). transformers' RoPE
# layer types are `main` and `compress`, which `layer_types` does not name.
_DSV4_COMPRESSED = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
_DSV4_THETA, _DSV4_COMPRESS_THETA, _DSV4_PARTIAL = 10000.0, 160000.0, 0.125
_DSV4_LEGACY_KEYS = ("compress_ratios", "rope_scaling")


def deepseek_v4(section: Mapping[str, Any]) -> Mapping[str, Any]:
    """A DeepSeek-V4 config in transformers 5's form: `rope_parameters` {main, compress}, `partial_rotary_factor`,
    layer types from compress_ratios."""
    rope = section.get("rope_parameters")
    if _is_nested(rope, {"main", "compress"}) and section.get("partial_rotary_factor") is not None \
            and not any(key in section for key in _DSV4_LEGACY_KEYS):
        return section  # saved by transformers 5
    out = {key: value for key, value in section.items() if key not in ("rope_scaling", "compress_ratios")}
    ratios = section.get("compress_ratios")
    if section.get("layer_types") is None and isinstance(ratios, list):
        unknown = [ratio for ratio in ratios if not isinstance(ratio, int) or isinstance(ratio, bool)
                   or ratio not in _DSV4_COMPRESSED]
        if unknown:
            raise ParameterError("compress_ratios", f"must each be one of {sorted(_DSV4_COMPRESSED)}, got "
                                                    f"{repr(unknown[0])[:40]}")
        out["layer_types"] = [_DSV4_COMPRESSED[ratio] for ratio in ratios]
    partial = section.get("partial_rotary_factor")
    if partial is None:
        partial = _int(section, "qk_rope_head_dim", 1) / _int(section, "head_dim", 512) \
            if section.get("qk_rope_head_dim") is not None else _DSV4_PARTIAL
    out["partial_rotary_factor"] = partial
    if _is_nested(rope, {"main", "compress"}):
        return out
    scaling = section.get("rope_scaling") or rope or {}
    if not isinstance(scaling, Mapping):
        raise ParameterError("rope_scaling", "must be a JSON object")
    yarn = {key: value for key, value in scaling.items() if key not in ("main", "compress", "type")}
    yarn.setdefault("rope_type", scaling.get("type", DEFAULT_ROPE_TYPE))
    compress = {**yarn, "rope_theta": _number(section, "compress_rope_theta", _DSV4_COMPRESS_THETA),
                "partial_rotary_factor": partial}
    # the reference leaves the compressed layers' cos and sin unscaled: a scaling with an attention factor (YaRN's)
    # gets 1 where the config names none
    spec = ROPE_TYPES.get(compress["rope_type"]) if isinstance(compress["rope_type"], str) else None
    if spec is not None and "attention_factor" in spec.reads:
        compress.setdefault("attention_factor", 1.0)
    out["rope_parameters"] = {
        "main": {"rope_type": DEFAULT_ROPE_TYPE, "rope_theta": _number(section, "rope_theta", _DSV4_THETA),
                 "partial_rotary_factor": partial},
        "compress": compress}
    return out


def _two_ropes(section: Mapping[str, Any], thetas: Mapping[str, tuple[str, float]], kinds: list[str],
               partial: float | None) -> dict[str, Any]:
    """A config with RoPE per layer type built from the hub's flat keys: `thetas` {layer type: (the key of its
    base, the class's default)}, the flat `rope_scaling` (if any) merged into each, `partial` each one's
    partial_rotary_factor (None: none stated)."""
    scaling = section.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ParameterError("rope_scaling", "must be a JSON object")
    out = {key: value for key, value in section.items() if key != "rope_scaling"}
    out["layer_types"] = kinds
    rope: dict[str, Any] = {}
    for kind, (key, default) in thetas.items():
        entry: dict[str, Any] = {"rope_type": DEFAULT_ROPE_TYPE, **(scaling or {})}
        entry["rope_theta"] = _number(section, key, default)
        if partial is not None:
            entry["partial_rotary_factor"] = partial
        rope[kind] = entry
    out["rope_parameters"] = rope
    return out


def _saved(section: Mapping[str, Any], names: set[str]) -> bool:
    """Already in transformers 5's form: RoPE per layer type and the layer types stated."""
    return isinstance(section.get("layer_types"), list) and _is_nested(section.get("rope_parameters"), names)


# ModernBertConfig (transformers 5.25, models/modernbert/configuration_modernbert.py): the published config.json
# gives every `global_attn_every_n_layers`-th layer (from the first) global attention over base `global_rope_theta`,
# the others local attention over `local_rope_theta`
_MODERNBERT = {"full_attention": ("global_rope_theta", 160_000.0), "sliding_attention": ("local_rope_theta", 10_000.0)}


def modernbert(section: Mapping[str, Any]) -> Mapping[str, Any]:
    """A ModernBERT config in transformers 5's form."""
    if _saved(section, set(_MODERNBERT)):
        return section
    kinds = section.get("layer_types")
    if not isinstance(kinds, list):
        every = _int(section, "global_attn_every_n_layers", 3)
        kinds = ["sliding_attention" if i % every else "full_attention" for i in range(_layer_count(section))]
    return _two_ropes(section, _MODERNBERT, kinds, None)


# MiMo-V2-Flash's published config.json (its makers' spelling; MiMoV2FlashConfig's defaults are the released model's
# values): `hybrid_layer_pattern` (1: a sliding-window layer), the full layers' base `rope_theta`, the sliding ones'
# `swa_rope_theta`, one `partial_rotary_factor` for both
_MIMO = {"full_attention": ("rope_theta", 5_000_000.0), "sliding_attention": ("swa_rope_theta", 10_000.0)}


def mimo_v2_flash(section: Mapping[str, Any]) -> Mapping[str, Any]:
    """A MiMo-V2-Flash config in transformers 5's form."""
    if _saved(section, set(_MIMO)):
        return section
    kinds = section.get("layer_types")
    pattern = section.get("hybrid_layer_pattern")
    if not isinstance(kinds, list) and isinstance(pattern, list):
        if not all(flag in (0, 1) and not isinstance(flag, float) for flag in pattern):
            raise ParameterError("hybrid_layer_pattern", "must be a list of 0 (full) and 1 (sliding window)")
        kinds = ["sliding_attention" if flag else "full_attention" for flag in pattern]
    elif not isinstance(kinds, list):
        kinds = ["full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention"
                 for i in range(_layer_count(section))]
    partial = section.get("partial_rotary_factor", 0.334)
    if isinstance(partial, bool) or not isinstance(partial, int | float):
        raise ParameterError("partial_rotary_factor", f"must be a number, got {repr(partial)[:40]}")
    return _two_ropes(section, _MIMO, kinds, float(partial))


# Step-3.5/3.7's published text config (Step3p7TextConfig, transformers 5.25, models/step3p7/configuration_step3p7.py):
# `rope_theta` and `partial_rotary_factors` one entry a layer (or one base for all), the full layers' scaling in
# `rope_scaling`; each layer type takes the values of its first layer
_STEP_THETA = 10_000.0


def _per_layer(section: Mapping[str, Any], key: str, index: int, default: float | None) -> float | None:
    value = section.get(key, default)
    if isinstance(value, list):
        if index >= len(value):
            raise ParameterError(key, f"has {len(value)} entries; layer {index} needs one")
        value = value[index]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ParameterError(key, f"must be positive numbers, got {repr(value)[:40]}")
    return float(value)


def step3p5(section: Mapping[str, Any]) -> Mapping[str, Any]:
    """A Step-3.5/3.7 text config in transformers 5's form."""
    kinds = section.get("layer_types")
    if not isinstance(kinds, list) or not all(isinstance(kind, str) for kind in kinds):
        kinds = ["full_attention"] * _layer_count(section)
    if _is_nested(section.get("rope_parameters"), set(kinds)):
        return section
    scaling = section.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, Mapping):
        raise ParameterError("rope_scaling", "must be a JSON object")
    rope: dict[str, Any] = {}
    for kind in sorted(set(kinds)):
        index = kinds.index(kind)
        entry: dict[str, Any] = {"rope_type": DEFAULT_ROPE_TYPE,
                                 "rope_theta": _per_layer(section, "rope_theta", index, _STEP_THETA)}
        partial = _per_layer(section, "partial_rotary_factors", index, None)
        if partial is not None:
            entry["partial_rotary_factor"] = partial
        if scaling and kind == "full_attention":
            entry.update(scaling)
        rope[kind] = entry
    out = {key: value for key, value in section.items()
           if key not in ("rope_theta", "partial_rotary_factors", "rope_scaling")}
    return {**out, "layer_types": kinds, "rope_parameters": rope}
