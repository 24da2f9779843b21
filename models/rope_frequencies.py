"""Inverse frequencies and attention factors of every rope_type, in float32 as transformers computes them.

One function per rope_type maps resolved `RopeParameters` (and the batch's sequence length, for the
types whose table depends on it) to float32 inv_freq; the attention-factor functions give the scale
folded into cos and sin. The rope_type registry (`posenc.models.rope_types`) says which function a type uses.

Reference: transformers 5.23.0 `modeling_rope_utils.py` (`ROPE_INIT_FUNCTIONS`) and
`LlamaRotaryEmbedding.compute_default_rope_parameters`; vLLM's `DynamicNTKAlphaRotaryEmbedding` and
`DeepseekScalingRotaryEmbedding` for the two inference-engine variants; docs/ENCODINGS.md §1.2, §14.

Precision (docs/ENCODINGS.md, precision contract): `inv_freq` is computed in float32 step by step
as transformers computes it: float32 pow, reciprocal-then-multiply for `scalar / tensor` (torch's
`Tensor.__rtruediv__`), true division for `tensor / scalar`, python scalars rounded to float32
before they meet a float32 tensor.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from posenc.models.errors import ParameterError

if TYPE_CHECKING:
    from posenc.models.rope_params import RopeParameters

F32 = np.float32

# Defaults transformers substitutes when a value is missing (yarn uses `or`, so 0 also means default).
YARN_BETA_FAST_DEFAULT = 32.0
YARN_BETA_SLOW_DEFAULT = 1.0


# --- float32 building blocks, each mirroring one torch op --------------------------------------


def _exponents(stop: int, denominator: int) -> np.ndarray:
    """`torch.arange(0, stop, 2, dtype=int64).float() / denominator` → float32 [ceil(stop/2)]."""
    return np.arange(0, stop, 2).astype(F32) / F32(denominator)


def _pow32(base: float | np.ndarray, exponent: float | np.ndarray) -> np.ndarray:
    """float32 `base ** exponent`, correctly rounded (both operands first rounded to float32).

    torch's float32 pow is within 1 ulp of this; numpy's float32 pow is up to 2 ulp off it.
    """
    b = np.asarray(base, dtype=F32).astype(np.float64)
    e = np.asarray(exponent, dtype=F32).astype(np.float64)
    return np.power(b, e).astype(F32)


def _rdiv32(numerator: float, x: np.ndarray) -> np.ndarray:
    """`numerator / x` for a python scalar and a float32 tensor: torch's `x.reciprocal() * numerator`."""
    return (F32(1.0) / x) * F32(numerator)


def _base_inv_freq(theta: float, stop: int, denominator: int) -> np.ndarray:
    """`1.0 / (theta ** (arange(0, stop, 2) / denominator))` in float32 → [ceil(stop/2)]."""
    return _rdiv32(1.0, _pow32(theta, _exponents(stop, denominator)))


def default_inv_freq(theta: float, dim: int) -> np.ndarray:
    """`1.0 / (theta ** (arange(0, dim, 2) / dim))` in float32 → [ceil(dim/2)]: the default RoPE frequencies,
    also XLNet's relative sinusoid (`XLNetModel.relative_positional_encoding`)."""
    return _base_inv_freq(theta, dim, dim)


def _field(p: RopeParameters, name: str) -> Any:
    """A field the formula of p.rope_type reads (always set by `make_rope_parameters`)."""
    value = getattr(p, name)
    if value is None:
        raise ParameterError(name, f"is required for rope_type {p.rope_type!r}")
    return value


# --- one function per rope_type: (params, seq_len) → float32 inv_freq --------------------------


def plain_inv_freq(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    """`compute_default_rope_parameters`: theta^(-2i/d)."""
    return _base_inv_freq(p.rope_theta, p.rotary_dim, p.rotary_dim)


def linear_inv_freq(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    """`_compute_linear_scaling_rope_parameters`: default inv_freq, then `inv_freq /= factor`."""
    return _base_inv_freq(p.rope_theta, p.rotary_dim, p.rotary_dim) / F32(_field(p, "factor"))


def dynamic_rope_theta(p: RopeParameters, seq_len: int | None) -> float:
    """Rescaled base of dynamic NTK for a batch of `seq_len` (`_compute_dynamic_ntk_parameters`).

    Up to max_position_embeddings the forward keeps the init-time inverse frequencies, whose base
    is computed in python float64; beyond it `dynamic_rope_update` passes `seq_len` as an int64
    tensor, which turns the whole expression into float32 tensor arithmetic.
    """
    d, factor, max_pos = p.rotary_dim, _field(p, "factor"), _field(p, "max_position_embeddings")
    if seq_len is None or seq_len <= max_pos:
        return p.rope_theta * ((factor * max_pos / max_pos) - (factor - 1)) ** (d / (d - 2))
    scale = F32(factor) * F32(seq_len) / F32(max_pos) - F32(factor - 1)
    # a 0-dim float32 tensor ** python float is evaluated in double and rounded once
    stretch = F32(np.float64(scale) ** (d / (d - 2)))
    return float(F32(p.rope_theta) * stretch)


def dynamic_inv_freq(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    return _base_inv_freq(dynamic_rope_theta(p, seq_len), p.rotary_dim, p.rotary_dim)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_attention_factor(p: RopeParameters) -> float:
    """`attention_factor`, else the mscale ratio (mscale and mscale_all_dim truthy), else 0.1 ln(s) + 1."""
    factor = _field(p, "factor")
    if p.attention_factor is not None:
        return p.attention_factor
    if p.mscale and p.mscale_all_dim:
        return float(_yarn_mscale(factor, p.mscale) / _yarn_mscale(factor, p.mscale_all_dim))
    return _yarn_mscale(factor)


def yarn_correction_range(p: RopeParameters) -> tuple[float, float]:
    """(low, high) pair indices of the YaRN ramp (`find_correction_range`, python float64)."""
    d, base, orig = p.rotary_dim, p.rope_theta, _field(p, "original_max_position_embeddings")

    def correction_dim(rotations: float) -> float:
        return (d * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(base))

    # `or`: transformers replaces a missing or zero beta by its default
    low = correction_dim(p.beta_fast or YARN_BETA_FAST_DEFAULT)
    high = correction_dim(p.beta_slow or YARN_BETA_SLOW_DEFAULT)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, d - 1)


def yarn_inv_freq(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    """`_compute_yarn_parameters`: blend of interpolated and extrapolated frequencies by a linear ramp."""
    pos_freqs = _pow32(p.rope_theta, _exponents(p.rotary_dim, p.rotary_dim))  # [d/2]
    extrapolation = _rdiv32(1.0, pos_freqs)
    interpolation = _rdiv32(1.0, F32(_field(p, "factor")) * pos_freqs)
    low, high = yarn_correction_range(p)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(p.rotary_dim // 2, dtype=F32) - F32(low)) / F32(high - low), F32(0), F32(1))
    extrapolation_factor = F32(1) - ramp
    return interpolation * (F32(1) - extrapolation_factor) + extrapolation * extrapolation_factor


def ntk_alpha_rope_theta(p: RopeParameters) -> float:
    """NTK-aware base stretched by a fixed alpha: theta · alpha^(d / (d − 2)) (python float64).

    vLLM `DynamicNTKAlphaRotaryEmbedding` and transformers' HunYuan `compute_ntk_alpha_rope_parameters`
    (checkpoints label it `dynamic` with an `alpha`); unlike `dynamic` it does not depend on the sequence.
    """
    d = p.rotary_dim
    return float(p.rope_theta * _field(p, "alpha") ** (d / (d - 2)))


def ntk_alpha_inv_freq(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    return _base_inv_freq(ntk_alpha_rope_theta(p), p.rotary_dim, p.rotary_dim)


def deepseek_yarn_attention_factor(p: RopeParameters) -> float:
    """vLLM `DeepseekScalingRotaryEmbedding.mscale`: mscale(s, mscale) / mscale(s, mscale_all_dim) · attn_factor.

    Unlike transformers' yarn the ratio is always taken (mscale defaults to 1, mscale_all_dim to 0, so a
    missing one does not fall back to 0.1 ln s + 1), and `attention_factor` (vLLM's attn_factor, default 1)
    multiplies it instead of replacing it.
    """
    factor = _field(p, "factor")
    mscale = 1.0 if p.mscale is None else p.mscale
    mscale_all_dim = p.mscale_all_dim or 0.0
    attn_factor = 1.0 if p.attention_factor is None else p.attention_factor
    return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim) * attn_factor)


def longrope_factor_set(p: RopeParameters, seq_len: int | None) -> Literal["short", "long"]:
    """long_factor iff the batch reaches past original_max_position_embeddings (`seq_len > Lorig`)."""
    return "long" if seq_len and seq_len > _field(p, "original_max_position_embeddings") else "short"


def longrope_attention_factor(p: RopeParameters) -> float:
    """`attention_factor`, else 1 for factor <= 1, else sqrt(1 + ln(factor) / ln(Lorig))."""
    factor, original = _field(p, "factor"), _field(p, "original_max_position_embeddings")
    if p.attention_factor is not None:
        return p.attention_factor
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def longrope_inv_freq(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    """`_compute_longrope_parameters`: `1 / (ext_factors * theta ** (arange(0, d, 2) / d))`."""
    chosen = _field(p, "long_factor" if longrope_factor_set(p, seq_len) == "long" else "short_factor")
    ext = np.asarray(chosen, dtype=F32)  # [d/2]
    return _rdiv32(1.0, ext * _pow32(p.rope_theta, _exponents(p.rotary_dim, p.rotary_dim)))


def llama3_inv_freq(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    """`_compute_llama3_parameters`: keep high frequencies, divide low ones by factor, smooth between."""
    old_len, low, high = (_field(p, n) for n in ("original_max_position_embeddings", "low_freq_factor",
                                                  "high_freq_factor"))
    factor = F32(_field(p, "factor"))
    inv_freq = _base_inv_freq(p.rope_theta, p.rotary_dim, p.rotary_dim)  # [d/2]
    wavelen = _rdiv32(2 * math.pi, inv_freq)
    low_freq_wavelen, high_freq_wavelen = F32(old_len / low), F32(old_len / high)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # low == high (Llama 4: 1 and 1): the band between is empty, the division by zero counts nowhere, as in
    # transformers, except at a wavelength of exactly original / low (NaN there: rope_types refuses it)
    with np.errstate(divide="ignore", invalid="ignore"):
        smooth = (_rdiv32(old_len, wavelen) - F32(low)) / F32(high - low)
        smoothed = (F32(1) - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


def proportional_inv_freq(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    """`_compute_proportional_rope_parameters`: head_dim in the exponent, zeros past rope_angles."""
    rope_angles = p.rotary_dim // 2
    rotated = _base_inv_freq(p.rope_theta, 2 * rope_angles, p.head_dim)  # [rope_angles]
    zeros = np.zeros(p.head_dim // 2 - rope_angles, dtype=F32)  # [head_dim/2 - rope_angles]
    return np.concatenate([rotated, zeros]) / F32(_field(p, "factor"))  # [head_dim/2]


def unit_attention_factor(p: RopeParameters) -> float:
    return 1.0
