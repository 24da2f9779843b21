"""The frequencies a file implies, and the known mistake that explains how they differ from the reference's.

A file fixes its RoPE frequencies directly (an ONNX constant, a checkpoint's inv_freq buffer), or through
metadata a runtime turns into them (GGUF: freq_base, dimension_count, the scaling keys, llama.cpp's
`rope_freqs` divisors or longrope's factor tensors). Each candidate mistake rebuilds the reference's float32
frequencies with that one mistake (the check's estimates: `estimate_theta`, `estimate_scaling`); the first
that equals the file's within float32 rounding names it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from posenc.models.diagnosis.rope import estimate_theta
from posenc.models.diagnosis.rope_search import estimable_types, estimate_scaling
from posenc.models.errors import ParameterError
from posenc.models.rope import RopeParameters, inv_freq_and_attention_factor
from posenc.models.rope_frequencies import F32, default_inv_freq
from posenc.models.rope_types import DEFAULT_ROPE_TYPE, rope_type_spec

# frequencies rebuilt from stored float32 divisors or constants differ from transformers' by a float32 rounding
FREQUENCY_RTOL = 2e-6


@dataclass(frozen=True)
class Frequencies:
    """float32 inverse frequencies and the attention factor folded into cos/sin."""

    inv_freq: np.ndarray
    attention_factor: float


@dataclass(frozen=True)
class Explanation:
    """The mistake that explains the file's frequencies: stable name, one sentence, what was estimated."""

    name: str
    explanation: str
    found: dict[str, str]


def same(a: np.ndarray, b: np.ndarray, rtol: float = FREQUENCY_RTOL) -> bool:
    """Equal shapes and values within `rtol` (float32 rounding of the same formula)."""
    return a.shape == b.shape and bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=0.0))


def golden(params: RopeParameters, seq_len: int | None) -> Frequencies:
    inv_freq, factor = inv_freq_and_attention_factor(params, seq_len)
    return Frequencies(inv_freq, factor)


def plain(theta: float, rotary_dim: int) -> np.ndarray:
    """Unscaled frequencies theta^(-2i/d), float32 [d/2]."""
    return default_inv_freq(theta, rotary_dim).astype(F32)


def divided(theta: float, rotary_dim: int, divisors: np.ndarray) -> np.ndarray:
    """llama.cpp's frequency factors: theta^(-2i/d) / factor_i in float32 (rope_freqs, rope_factors_*); NaN
    frequencies (no match for any) when there are not d/2 divisors."""
    base = plain(theta, rotary_dim)
    if divisors.shape != base.shape:
        return np.full(base.shape, np.nan, dtype=F32)
    return (base / divisors.astype(F32)).astype(F32)


def theta_of(inv_freq: np.ndarray, rotary_dim: int) -> float | None:
    """The base of the two highest frequencies (left unscaled by llama3 and yarn; linear scales both alike):
    inv_freq[0] / inv_freq[1] = theta^(2/d); a round value where one is within float32 rounding."""
    first = inv_freq.astype(np.float64)[:2]
    if inv_freq.shape[0] < 2 or not np.all(np.isfinite(first)) or not np.all(first > 0):
        return None
    try:
        theta = float(first[0] / first[1]) ** (rotary_dim / 2)
    except OverflowError:
        return None
    if not math.isfinite(theta) or theta <= 1:
        with np.errstate(all="ignore"):
            return estimate_theta(inv_freq.astype(np.float64), rotary_dim, 1 << 20)
    nice = float(f"{theta:.3g}")
    return nice if abs(nice - theta) <= 2e-3 * theta else theta


def _candidates(ref: RopeParameters, file: np.ndarray, seq_len: int | None
                ) -> Iterator[tuple[str, str, dict[str, str], Callable[[], np.ndarray | None]]]:
    spec = rope_type_spec(ref.rope_type)
    n = ref.rotary_dim
    base = golden(ref, seq_len).inv_freq
    unscaled = plain(ref.rope_theta, n)
    if spec.scaled:
        yield ("scaling_missing", f"the {ref.rope_type} scaling of the frequencies is missing: they are unscaled "
               f"RoPE (theta {ref.rope_theta:g})", {}, lambda: unscaled)
    theta = theta_of(file, n) if file.ndim == 1 else None
    if theta is not None and theta != ref.rope_theta:
        found = {"rope_theta": f"{theta:g}"}
        yield ("wrong_theta", f"the base (rope_theta) is {theta:g}, the model's is {ref.rope_theta:g}", found,
               lambda: golden(dataclasses.replace(ref, rope_theta=theta), seq_len).inv_freq)
        if spec.scaled:
            yield ("wrong_theta+scaling_missing", f"two mistakes: base {theta:g} instead of {ref.rope_theta:g}, "
                   f"and the {ref.rope_type} scaling missing", found, lambda: plain(theta, n))
    if ref.rope_type in estimable_types() and file.ndim == 1:
        fitted = estimate_scaling(ref, ref.rope_type, file.astype(np.float64), seq_len or 1, 1 << 20)
        if fitted is not None and fitted[0] != ref:
            p = fitted[0]
            changed = {name: f"{getattr(p, name):g}" for name in ("factor", "original_max_position_embeddings",
                                                                    "max_position_embeddings")
                       if getattr(p, name) != getattr(ref, name) and getattr(p, name) is not None}
            which = "scaling_original_length_wrong" if "factor" not in changed else "scaling_factor_wrong"
            yield (which, f"the {ref.rope_type} scaling has " + ", ".join(f"{k} {v}" for k, v in changed.items())
                   + "; the model's is " + ", ".join(f"{k} {getattr(ref, k):g}" for k in changed), changed,
                   lambda: golden(p, seq_len).inv_freq)
        if spec.scaled:
            yield ("scaling_applied_twice", f"the {ref.rope_type} scaling was applied twice", {},
                   lambda: (base * (base / unscaled)).astype(F32))
    if ref.rotary_dim < ref.head_dim and not spec.whole_head:
        spread = (F32(1.0) / np.power(np.float64(ref.rope_theta), np.arange(0, n, 2) / ref.head_dim).astype(F32))
        yield ("partial_rotary_wrong", f"the frequencies spread over all {ref.head_dim} head channels (exponent "
               f"2i/head_dim) instead of the {n} rotated ones", {}, lambda: spread.astype(F32))
    if spec.switch_length is not None:
        length = spec.switch_length(ref)
        short = golden(ref, length).inv_freq
        long = golden(ref, length + 1).inv_freq
        flipped = short if (seq_len or 0) > length else long
        yield ("longrope_short_long_swapped", "the short and the long factor sets are exchanged", {},
               lambda: flipped)


def explain(ref: RopeParameters, file: np.ndarray, seq_len: int | None) -> Explanation | None:
    """The first known mistake whose frequencies equal the file's (None: none does)."""
    if file.shape != (ref.n_frequencies,):
        return Explanation("partial_rotary_dim_wrong", f"the file has {file.shape[-1]} frequencies (rotary dim "
                           f"{2 * file.shape[-1]}); the model has {ref.n_frequencies} (rotary dim {ref.table_dim})",
                           {"rotary_dim": str(2 * file.shape[-1])})
    for name, why, found, build in _candidates(ref, file, seq_len):
        try:
            candidate = build()
        except (ParameterError, ValueError, ZeroDivisionError, FloatingPointError):
            continue
        if candidate is not None and same(file, candidate):
            return Explanation(name, why, found)
    return None


def describe(params: RopeParameters) -> dict[str, Any]:
    """The fields of `params` its rope_type reads, for a report."""
    spec = rope_type_spec(params.rope_type)
    out: dict[str, Any] = {"rope_type": params.rope_type, "rope_theta": params.rope_theta,
                           "rotary_dim": params.rotary_dim}
    for name in sorted(spec.reads):
        value = getattr(params, name)
        if value is not None and not isinstance(value, tuple):
            out[name] = value
    return out


def unscaled_type() -> str:
    return DEFAULT_ROPE_TYPE
