"""TEMPORARY minimal RoPE parameters (default and llama3 only) until the `rope` branch lands.

Same public names as the real `models/rope.py`; the inference feature builds against these names only.
inv_freq follows transformers 5.23 (float32 step by step, ENCODINGS.md §1.2).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from models.errors import ParameterError

RopeType = Literal["default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional"]


@dataclass(frozen=True)
class RopeParameters:
    head_dim: int
    rotary_dim: int
    rope_theta: float = 10000.0
    rope_type: RopeType = "default"
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    partial_rotary_factor: float = 1.0


def make_rope_parameters(**kwargs: Any) -> RopeParameters:
    """Validated parameters; `rotary_dim` resolved from `partial_rotary_factor` when not given."""
    head_dim = int(kwargs.get("head_dim") or 0)
    if head_dim <= 0:
        raise ParameterError("head_dim", f"must be > 0 (got {kwargs.get('head_dim')!r})")
    prf = float(kwargs.get("partial_rotary_factor", 1.0))
    rotary_dim = kwargs.get("rotary_dim") or int(head_dim * prf)
    if rotary_dim <= 0 or rotary_dim > head_dim or rotary_dim % 2:
        raise ParameterError("rotary_dim", f"must be even and in [2, head_dim] (got {rotary_dim})")
    rope_type = kwargs.get("rope_type", "default")
    if rope_type not in ("default", "llama3"):
        raise ParameterError("rope_type", f"temporary implementation supports default and llama3 (got {rope_type!r})")
    fields = {k: v for k, v in kwargs.items() if k in RopeParameters.__dataclass_fields__}
    params = RopeParameters(**{**fields, "head_dim": head_dim, "rotary_dim": int(rotary_dim)})
    if rope_type == "llama3":
        params = replace(
            params,
            factor=params.factor if params.factor is not None else 8.0,
            low_freq_factor=params.low_freq_factor if params.low_freq_factor is not None else 1.0,
            high_freq_factor=params.high_freq_factor if params.high_freq_factor is not None else 4.0,
            original_max_position_embeddings=params.original_max_position_embeddings or 8192,
        )
    return params


def rope_parameters_from_config(config: Mapping[str, Any]) -> tuple[RopeParameters, dict[str, Any]]:
    """HF config.json (v4 `rope_scaling` or v5 `rope_parameters`) → parameters + info."""
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kwargs: dict[str, Any] = {
        "head_dim": head_dim,
        "rope_theta": rope.get("rope_theta", config.get("rope_theta", 10000.0)),
        "rope_type": rope.get("rope_type", rope.get("type", "default")),
        "partial_rotary_factor": rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)),
        "max_position_embeddings": config.get("max_position_embeddings"),
    }
    for key in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"):
        if key in rope:
            kwargs[key] = rope[key]
    return make_rope_parameters(**kwargs), {"max_position_embeddings": config.get("max_position_embeddings")}


def _default_inv_freq(theta: float, dim: int) -> np.ndarray:
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)


def inv_freq_and_attention_factor(params: RopeParameters, seq_len: int | None = None) -> tuple[np.ndarray, float]:
    """float32 inv_freq [rotary_dim // 2] and the attention factor."""
    inv = _default_inv_freq(params.rope_theta, params.rotary_dim)
    if params.rope_type == "llama3":
        factor = np.float32(params.factor)
        low, high = float(params.low_freq_factor or 1.0), float(params.high_freq_factor or 4.0)
        orig = float(params.original_max_position_embeddings or 8192)
        wavelen = np.float32(2 * math.pi) / inv
        low_wavelen, high_wavelen = orig / low, orig / high
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (np.float32(orig) / wavelen - np.float32(low)) / np.float32(high - low)
        smoothed = (np.float32(1) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    return inv, 1.0
