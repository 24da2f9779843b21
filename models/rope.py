"""Rotary position embedding (RoPE) tables: inverse frequencies, attention factor, cos/sin.

Reference: huggingface/transformers 5.23.0 `src/transformers/modeling_rope_utils.py`
(`ROPE_INIT_FUNCTIONS`, `dynamic_rope_update`) and `models/llama/modeling_llama.py`
(`LlamaRotaryEmbedding`); semantics in ENCODINGS.md §1 and §2.

Precision contract (ENCODINGS.md): `inv_freq` is computed in float32 step by step as transformers
computes it (that vector is what models were trained with): float32 pow, reciprocal-then-multiply
for `scalar / tensor` (torch's `Tensor.__rtruediv__`), true division for `tensor / scalar`, python
scalars rounded to float32 before they meet a float32 tensor. Angles, cos and sin are then
evaluated in float64 from that float32 vector, multiplied by the attention factor and cast once.

Numpy only: no torch, no HTTP.
"""

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from models.dtypes import np_dtype
from models.errors import ParameterError
from models.rope_config import rope_parameters_from_config
from models.rope_params import (
    ROPE_TYPES,
    YARN_BETA_FAST_DEFAULT,
    YARN_BETA_SLOW_DEFAULT,
    RopeParameters,
    RopeType,
    make_rope_parameters,
)

__all__ = [
    "ROPE_TYPES",
    "Form",
    "Layout",
    "RopeInfo",
    "RopeParameters",
    "RopeType",
    "inv_freq_and_attention_factor",
    "make_rope_parameters",
    "rope_cos_sin",
    "rope_parameters_from_config",
]

F32 = np.float32
Layout = Literal["half", "interleaved"]
Form = Literal["full", "half"]


@dataclass(frozen=True)
class RopeInfo:
    """What a table was computed with, beyond the parameters.

    inv_freq: float32 [n_frequencies]; attention_factor: folded into cos and sin;
    seq_len: largest position + 1 (the batch length transformers' forward would see);
    factor_set: "short" / "long" for longrope, else None;
    dynamic_rope_theta: the rescaled base of dynamic NTK (float32 value), else None.
    """

    inv_freq: np.ndarray
    attention_factor: float
    seq_len: int
    factor_set: Literal["short", "long"] | None = None
    dynamic_rope_theta: float | None = None


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


# --- one function per rope_type -----------------------------------------------------------------


def _field(p: RopeParameters, name: str) -> Any:
    """A field the formula of p.rope_type reads (always set by `make_rope_parameters`)."""
    value = getattr(p, name)
    if value is None:
        raise ParameterError(name, f"is required for rope_type {p.rope_type!r}")
    return value


def _linear(p: RopeParameters) -> np.ndarray:
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


def _dynamic(p: RopeParameters, seq_len: int | None) -> np.ndarray:
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


def _yarn(p: RopeParameters) -> np.ndarray:
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


def _longrope(p: RopeParameters, seq_len: int | None) -> np.ndarray:
    """`_compute_longrope_parameters`: `1 / (ext_factors * theta ** (arange(0, d, 2) / d))`."""
    chosen = _field(p, "long_factor" if longrope_factor_set(p, seq_len) == "long" else "short_factor")
    ext = np.asarray(chosen, dtype=F32)  # [d/2]
    return _rdiv32(1.0, ext * _pow32(p.rope_theta, _exponents(p.rotary_dim, p.rotary_dim)))


def _llama3(p: RopeParameters) -> np.ndarray:
    """`_compute_llama3_parameters`: keep high frequencies, divide low ones by factor, smooth between."""
    old_len, low, high = (_field(p, n) for n in ("original_max_position_embeddings", "low_freq_factor",
                                                  "high_freq_factor"))
    factor = F32(_field(p, "factor"))
    inv_freq = _base_inv_freq(p.rope_theta, p.rotary_dim, p.rotary_dim)  # [d/2]
    wavelen = _rdiv32(2 * math.pi, inv_freq)
    low_freq_wavelen, high_freq_wavelen = F32(old_len / low), F32(old_len / high)
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (_rdiv32(old_len, wavelen) - F32(low)) / F32(high - low)
    smoothed = (F32(1) - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled)


def _proportional(p: RopeParameters) -> np.ndarray:
    """`_compute_proportional_rope_parameters`: head_dim in the exponent, zeros past rope_angles."""
    rope_angles = p.rotary_dim // 2
    rotated = _base_inv_freq(p.rope_theta, 2 * rope_angles, p.head_dim)  # [rope_angles]
    zeros = np.zeros(p.head_dim // 2 - rope_angles, dtype=F32)  # [head_dim/2 - rope_angles]
    return np.concatenate([rotated, zeros]) / F32(_field(p, "factor"))  # [head_dim/2]


def inv_freq_and_attention_factor(
    params: RopeParameters, seq_len: int | None = None
) -> tuple[np.ndarray, float]:
    """Inverse frequencies (float32 [rotary_dim/2]; proportional [head_dim/2]) and attention factor.

    `seq_len` is the largest position + 1 of the batch; it matters for `dynamic` (rescaled base
    beyond max_position_embeddings) and `longrope` (long factors beyond the original length), as in
    transformers' `dynamic_rope_update`. None = at init time (no batch seen yet).
    """
    p = params
    attention_factor = 1.0
    if p.rope_type == "default":
        inv_freq = _base_inv_freq(p.rope_theta, p.rotary_dim, p.rotary_dim)
    elif p.rope_type == "linear":
        inv_freq = _linear(p)
    elif p.rope_type == "dynamic":
        inv_freq = _dynamic(p, seq_len)
    elif p.rope_type == "yarn":
        inv_freq, attention_factor = _yarn(p), yarn_attention_factor(p)
    elif p.rope_type == "longrope":
        inv_freq, attention_factor = _longrope(p, seq_len), longrope_attention_factor(p)
    elif p.rope_type == "llama3":
        inv_freq = _llama3(p)
    elif p.rope_type == "proportional":
        inv_freq = _proportional(p)
    else:
        known = ", ".join(ROPE_TYPES)
        raise ParameterError("rope_type", f"unknown rope_type {p.rope_type!r}; known: {known}")
    return inv_freq.astype(F32), float(attention_factor)


def _expand(table: np.ndarray, layout: Layout) -> np.ndarray:
    """[rows, d/2] → [rows, d]: `cat(t, t)` (half, rotate_half) or each column twice (interleaved, GPT-J)."""
    if layout == "half":
        return np.concatenate([table, table], axis=1)  # [rows, d]
    return np.repeat(table, 2, axis=1)  # [rows, d]


def rope_cos_sin(
    params: RopeParameters,
    max_position: int,
    offset: int = 0,
    layout: Layout = "half",
    form: Form = "full",
    dtype: npt.DTypeLike | str = np.float32,
) -> tuple[np.ndarray, np.ndarray, RopeInfo]:
    """cos and sin tables for positions offset .. offset + max_position - 1.

    Shapes: form="full" → [max_position, table_dim] in `layout` order (half: `cat(freqs, freqs)` as
    LlamaRotaryEmbedding.forward; interleaved: each pair's value twice, GPT-J); form="half" →
    [max_position, table_dim/2] (one column per frequency: onnx RotaryEmbedding / flash-attention
    cache layout; `layout` does not apply). Both include the attention factor, like transformers'
    cos/sin. For dynamic and longrope the frequencies are those of a batch whose largest position
    is the last row (seq_len = offset + max_position). dtype: numpy dtype or API name
    (float32/float16/bfloat16/float64); values are computed in float64 and cast once.
    """
    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position < 1:
        raise ParameterError("max_position", f"must be an integer >= 1, got {max_position!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ParameterError("offset", f"must be an integer >= 0, got {offset!r}")
    if layout not in ("half", "interleaved"):
        raise ParameterError("layout", f"must be 'half' or 'interleaved', got {layout!r}")
    if form not in ("full", "half"):
        raise ParameterError("form", f"must be 'full' or 'half', got {form!r}")
    out_dtype = np_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)

    seq_len = offset + max_position
    inv_freq, attention_factor = inv_freq_and_attention_factor(params, seq_len)
    positions = np.arange(offset, seq_len, dtype=np.float64)  # [max_position]
    angles = positions[:, None] * inv_freq.astype(np.float64)[None, :]  # [max_position, table_dim/2]
    cos, sin = np.cos(angles), np.sin(angles)
    if attention_factor != 1.0:
        cos *= attention_factor
        sin *= attention_factor
    cos_out, sin_out = cos.astype(out_dtype), sin.astype(out_dtype)
    if form == "full":
        cos_out, sin_out = _expand(cos_out, layout), _expand(sin_out, layout)
    info = RopeInfo(
        inv_freq=inv_freq,
        attention_factor=attention_factor,
        seq_len=seq_len,
        factor_set=longrope_factor_set(params, seq_len) if params.rope_type == "longrope" else None,
        dynamic_rope_theta=dynamic_rope_theta(params, seq_len) if params.rope_type == "dynamic" else None,
    )
    return cos_out, sin_out, info
