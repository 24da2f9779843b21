"""A preset's parameters for each table kind, named as the API names them (query parameters).

Each kind reads the preset's config through the resolver an uploaded config.json goes through: RoPE through
`rope_parameters_from_config` (so `GET /v1/rope?preset=` and `POST /v1/rope/from-config` with the preset's
config resolve alike), vision RoPE through `vision_rope_from_config`; the bias and sinusoidal families read
their few keys as their transformers config classes name them. Lengths (rows, query and key lengths) are the
request's, not the model's, except the RoPE rows: the model's context, as from-config defaults them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from posenc.models.errors import ParameterError
from posenc.models.presets import Preset
from posenc.models.rope_config import rope_parameters_from_config
from posenc.models.rope_params import RopeParameters
from posenc.models.rope_types import ROPE_TYPES, api_spelling
from posenc.models.vision_rope import vision_rope_from_config
from posenc.models.vision_towers import tower_from_config


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    """The first of `keys` the config holds (model classes name one fact differently)."""
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    raise ParameterError(keys[0], "missing in the preset's config")


def rope_values(params: RopeParameters) -> dict[str, Any]:
    """`GET /v1/rope` query values that resolve to `params` (engine variants in their API spelling)."""
    rope_type, extra = api_spelling(params.rope_type)
    values: dict[str, Any] = {"head_dim": params.head_dim, "rope_theta": params.rope_theta, "rope_type": rope_type,
                              "partial_rotary_factor": params.partial_rotary_factor, **extra}
    for name in sorted(ROPE_TYPES[params.rope_type].reads):
        value = getattr(params, name)
        if value is None:
            continue
        values[name] = ",".join(repr(float(v)) for v in value) if isinstance(value, tuple) else value
    return values


def _rope(preset: Preset) -> dict[str, Any]:
    params, info = rope_parameters_from_config(preset.config, layer_type=preset.serving.get("layer_type"))
    values = rope_values(params)
    if preset.serving.get("yarn_mscale"):
        values["yarn_mscale"] = preset.serving["yarn_mscale"]
    if info["max_position_embeddings"] is not None:
        values["max_position"] = info["max_position_embeddings"]
    if preset.serving.get("layout"):
        values["layout"] = preset.serving["layout"]
    return values


def _mrope(preset: Preset) -> dict[str, Any]:
    params, info = rope_parameters_from_config(preset.config)
    vision = preset.config.get("vision_config") or {}
    values: dict[str, Any] = {"model": preset.config["model_type"], "head_dim": params.head_dim,
                              "rope_theta": params.rope_theta,
                              "mrope_section": ",".join(str(v) for v in info["mrope_section"]),
                              "interleaved": info["mrope_interleaved"]}
    for name in ("spatial_merge_size", "tokens_per_second"):
        if vision.get(name) is not None:
            values[name] = vision[name]
    return values


def _vision_rope(preset: Preset) -> dict[str, Any]:
    found = vision_rope_from_config(preset.config, preset.serving.get("tower"))
    if found is None:
        raise ParameterError("preset", f"{preset.name} has no vision config")
    return {"model": found.model, "head_dim": found.head_dim, "rope_theta": found.rope_theta,
            "image_size": found.image_size, "patch_size": found.patch_size}


def _vision_tower(preset: Preset) -> dict[str, Any]:
    """`GET /v1/rope/vision/tower`'s values: the tower from-config?tower=vision reads in the preset's config."""
    tower = tower_from_config(preset.config, True)
    if tower is None:
        raise ParameterError("preset", f"{preset.name} has no vision tower config")
    return {"vision_tower": tower.scheme.name, "head_dim": tower.head_dim, "rope_theta": tower.rope_theta,
            "spatial_merge_size": tower.merge, "window": tower.window}


def _alibi(preset: Preset) -> dict[str, Any]:
    values: dict[str, Any] = {"num_heads": _first(preset.config, "n_head", "n_heads", "num_attention_heads"),
                              "mode": preset.serving["mode"]}
    attn = preset.config.get("attn_config") or {}
    if attn.get("alibi_bias_max") is not None:  # MPT's
        values["alibi_bias_max"] = attn["alibi_bias_max"]
    return values


def _t5(preset: Preset) -> dict[str, Any]:
    return {"num_buckets": preset.config["relative_attention_num_buckets"],
            "max_distance": preset.config["relative_attention_max_distance"],
            "bidirectional": preset.serving["bidirectional"]}


def _deberta(preset: Preset) -> dict[str, Any]:
    config = preset.config
    # DebertaV2Encoder: max_relative_positions < 1 means max_position_embeddings
    max_relative = config["max_relative_positions"]
    if max_relative < 1:
        max_relative = config["max_position_embeddings"]
    return {"position_buckets": config["position_buckets"], "max_relative_positions": max_relative}


def _xlnet(preset: Preset) -> dict[str, Any]:
    return {name: preset.config[name] for name in ("d_model", "attn_type", "bi_data", "clamp_len")}


def _sinusoidal(preset: Preset) -> dict[str, Any]:
    config, variant = preset.config, preset.serving["variant"]
    values: dict[str, Any] = {"dim": config["d_model"], "variant": variant,
                              "max_position": _first(config, "max_source_positions", "max_position_embeddings")}
    if variant == "fairseq":
        values["padding_idx"] = config["pad_token_id"]
    return values


# table kind → its parameters from a preset
TABLE_KINDS: Mapping[str, Callable[[Preset], dict[str, Any]]] = {
    "rope": _rope, "multimodal_rope": _mrope, "vision_rope": _vision_rope, "vision_tower": _vision_tower,
    "alibi": _alibi, "t5": _t5,
    "deberta": _deberta, "xlnet": _xlnet, "sinusoidal": _sinusoidal,
}


def preset_values(preset: Preset, kind: str) -> dict[str, Any]:
    """The query values of table kind `kind` for `preset` (a ParameterError when the preset has no such table)."""
    if kind not in preset.tables:
        raise ParameterError("preset", f"{preset.name} is a {preset.family} model; it has no {kind} table")
    return TABLE_KINDS[kind](preset)
