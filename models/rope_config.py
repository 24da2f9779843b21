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
Multimodal configs whose text model sits under `text_config` are read from there. Older spellings that
a model's config class reads under other names are read as it does: GPT-NeoX's `rotary_pct` and
`rotary_emb_base` (GPTNeoXConfig.convert_rope_params_to_dict), GPT-J's `n_embd`, `n_head`, `n_positions`
(GPTJConfig.attribute_map) and `rotary_dim` (its rotated channels of each head).
"""

import copy
from collections.abc import Mapping
from typing import Any

from posenc.models.bounds import DEFAULT_ROPE_THETA
from posenc.models.errors import ParameterError
from posenc.models.mrope import check_mrope_section
from posenc.models.rope_params import RopeParameters, make_rope_parameters
from posenc.models.rope_types import DEFAULT_ROPE_TYPE, ROPE_TYPES, resolve_variant, rope_type_spec


def _model_section(config: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """The mapping that describes the text model: the config itself, or its `text_config`."""
    has_head = any(key in config for key in ("head_dim", "hidden_size", "num_attention_heads"))
    text = config.get("text_config")
    if not has_head and isinstance(text, Mapping):
        return "text_config", text
    return "", config


# model_type → {config.json key: the name the resolver reads} (the config classes' own renames)
_RENAMED_KEYS: dict[str, dict[str, str]] = {
    "gpt_neox": {"rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"},
    "gptj": {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_positions": "max_position_embeddings"},
}


def _with_class_spellings(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """`config` with the keys its model class renames read under the resolver's names (a given new name wins)."""
    renamed = _RENAMED_KEYS.get(str(config.get("model_type", "")))
    if renamed is None:
        return config
    out = dict(config)
    for old, new in renamed.items():
        if old in config and config.get(new) is None:
            out[new] = config[old]
    rotary_dim = config.get("rotary_dim")
    if config.get("model_type") == "gptj" and isinstance(rotary_dim, int) and _positive_int(rotary_dim) \
            and out.get("partial_rotary_factor") is None:
        head_dim = _head_dim(out, None)
        fits = isinstance(head_dim, int) and rotary_dim <= head_dim
        if not fits or int(head_dim * (rotary_dim / head_dim)) != rotary_dim:
            raise ParameterError("rotary_dim", f"must be an even number of channels <= head_dim, got {rotary_dim!r}")
        out["partial_rotary_factor"] = rotary_dim / head_dim
    return out


def _head_dim(config: Mapping[str, Any], layer_type: str | None) -> Any:
    """`config.head_dim or hidden_size // num_attention_heads` of the layers of `layer_type`.

    Per layer type: the layer's overrides in `per_layer_config` (transformers 5's HeterogeneousConfigMixin, which
    Gemma-4 writes its global head size into); without that key, Gemma-4's `global_head_dim` on full-attention
    layers (Gemma4TextConfig builds per_layer_config from it only when the config has none). DeepSeek-V2/V3
    (`qk_rope_head_dim`): only that part of the head is rotated.
    """
    if "per_layer_config" in config:
        config = _layer_config(config, layer_type)
    elif layer_type == "full_attention" and config.get("global_head_dim"):
        return config["global_head_dim"]
    if config.get("qk_rope_head_dim"):  # DeepSeek-V2/V3 MLA: DeepseekV3Config sets head_dim to it
        return config["qk_rope_head_dim"]
    if config.get("head_dim"):
        return config["head_dim"]
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and _positive_int(hidden) and _positive_int(heads):
        return hidden // heads
    raise ParameterError(
        "head_dim",
        "config.json has no head size: give head_dim, or hidden_size and num_attention_heads "
        "(positive integers)",
    )


def _layer_config(config: Mapping[str, Any], layer_type: str | None) -> Mapping[str, Any]:
    """`config` as the layers of `layer_type` see it: the global keys with that layer type's `per_layer_config`
    overrides on top, as transformers 5.23's `config.per_layer_config[layer_type]` builds it
    (integrations/heterogeneity/configuration_utils.py, `_PerLayerConfigView.__getitem__`).

    `per_layer_config`: {layer index (a decimal string, zero-padded as `to_dict` writes it): {attribute: value}},
    sparse (layers without overrides are left out). Every layer of the type must carry the same overrides
    (transformers: ValueError, here ParameterError); `layer_type` None, or absent from `layer_types`: `config`.
    """
    per_layer = config.get("per_layer_config")
    layer_types = config.get("layer_types")
    if per_layer is None or layer_type is None or not isinstance(layer_types, list) or layer_type not in layer_types:
        return config
    if not isinstance(per_layer, Mapping):
        raise ParameterError("per_layer_config", "must be an object of layer index -> overrides")
    overrides: dict[int, Mapping[str, Any]] = {}
    for key, value in per_layer.items():
        index = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10 else -1
        if not 0 <= index < len(layer_types):
            raise ParameterError("per_layer_config", f"keys must be layer indices in [0, {len(layer_types)}), "
                                                     f"got {str(key)[:20]!r}")
        if not isinstance(value, Mapping):
            raise ParameterError("per_layer_config", f"the overrides of layer {index} must be an object")
        overrides[index] = value
    first = overrides.get(layer_types.index(layer_type), {})
    for index, kind in enumerate(layer_types):
        if kind == layer_type and dict(overrides.get(index, {})) != dict(first):
            raise ParameterError("per_layer_config", f"layer type {layer_type!r} is not homogeneous across layers "
                                                     f"(layer {index} differs)")
    return {**config, **{key: value for key, value in first.items() if key != "skip"}}


def rope_layer_types(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The layer types a per-layer-type `rope_parameters` gives a RoPE each (Gemma 3 and 4 as transformers 5
    writes them: `("full_attention", "sliding_attention")`), sorted as transformers' rotary modules take them
    (`sorted(set(config.layer_types))`); () for one RoPE for all layers. A `None` entry (a NoPE layer type) is
    left out; so is anything that does not parse (the resolver names what is wrong)."""
    if not isinstance(config, Mapping):
        return ()
    _, cfg = _model_section(config)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    labels = cfg.get("_rope_type_labels") or cfg.get("layer_types")
    if not isinstance(rope, Mapping) or not isinstance(labels, list | tuple):
        return ()
    return tuple(sorted(key for key in rope if key in labels and rope[key] is not None))


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _select_entry(
    rope: dict[str, Any], config: Mapping[str, Any], layer_type: str | None
) -> tuple[dict[str, Any], bool]:
    """(the RoPE dict that applies, whether the config is nested per layer type)."""
    labels = config.get("_rope_type_labels") or config.get("layer_types") or ()
    nested_keys = [key for key in rope if isinstance(labels, list | tuple) and key in labels]
    if not nested_keys:
        if layer_type is not None:
            raise ParameterError("layer_type", "this config has one RoPE for all layers; omit layer_type")
        return rope, False
    if layer_type not in nested_keys:
        raise ParameterError(
            "layer_type", f"this config has per-layer RoPE; choose one of {', '.join(sorted(nested_keys))}"
        )
    entry = rope[layer_type]
    if entry is None:
        raise ParameterError("layer_type", f"layer type {layer_type!r} has no RoPE (NoPE layer)")
    if not isinstance(entry, dict):
        raise ParameterError("rope_parameters", f"entry for {layer_type!r} must be an object")
    return entry, True


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
    config: Mapping[str, Any], *, layer_type: str | None = None
) -> tuple[RopeParameters, dict[str, Any]]:
    """Resolve a Hugging Face `config.json` object to RopeParameters (+ info).

    `layer_type` picks one entry of a per-layer (nested) `rope_parameters`, e.g. Gemma's
    "full_attention" / "sliding_attention"; it is required for such configs and refused otherwise.
    info: `max_position_embeddings` (None if absent), `rope_source` ("rope_scaling",
    "rope_parameters" or "none"), `config_section` ("" or "text_config"), `layer_type`.
    """
    if not isinstance(config, Mapping):
        raise ParameterError("config", "config.json must be a JSON object")
    section, cfg = _model_section(config)
    cfg = _with_class_spellings(cfg)
    source = next((key for key in ("rope_scaling", "rope_parameters") if cfg.get(key)), "none")
    rope = copy.deepcopy(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    if not isinstance(rope, dict):
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
        head_dim=_head_dim(cfg, layer_type),
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
        **_mrope_info(config, cfg, entry, params),
    }
    return params, info


def _mrope_info(config: Mapping[str, Any], cfg: Mapping[str, Any], entry: Mapping[str, Any],
                params: RopeParameters) -> dict[str, Any]:
    """`mrope_section` and `mrope_interleaved` of a Qwen2-VL family config (validated), else {}.

    Qwen3-VL's rotary module always interleaves (whatever `mrope_interleaved` says); Qwen2-VL and
    Qwen2.5-VL never do.
    """
    section = entry.get("mrope_section")
    if section is None:
        return {}
    if not isinstance(section, list):
        raise ParameterError("mrope_section", f"must be a list of three integers, got {section!r}")
    model_types = {str(c.get("model_type", "")) for c in (config, cfg)}
    interleaved = any(m.startswith("qwen3") for m in model_types) or bool(entry.get("mrope_interleaved"))
    return {"mrope_section": list(check_mrope_section(section, params.n_frequencies)),
            "mrope_interleaved": interleaved}


def _null_theta() -> float:
    raise ParameterError("rope_theta", "is null in config.json; give a number or leave it out")
