"""RoPE properties (RoFormer, Su et al. 2021, §3.4): relativity, norm preservation, long-range decay,
uniqueness per dtype, extrapolation of each frequency, and permutation equivariance.

Rows are the served ones: cos/sin of positions × inv_freq evaluated in float64, times the attention
factor, cast once to the served dtype (`posenc.models.rope.rope_cos_sin`); rotations use the half layout
(rotate_half, Llama/NeoX), whose inner products equal the interleaved layout's.
"""

from dataclasses import dataclass

import numpy as np

from posenc.models.dtypes import cast
from posenc.models.properties.measures import (
    adjacent_distance,
    attention,
    first_collision_position,
    permutation_residual,
)
from posenc.models.rope import RopeParameters, rope_cos_sin
from posenc.models.rope_types import default_inv_freq

EQUIVARIANCE_TOKENS = 16


def rope_rows(inv_freq: np.ndarray, attention_factor: float, positions: np.ndarray,
              dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin rows [N, n_freq] for any integer positions (negative too), as the served table
    computes them: float64 angles from the float32 inv_freq, times the attention factor, cast once."""
    angles = positions.astype(np.float64)[:, None] * inv_freq.astype(np.float64)[None, :]  # [N, n_freq]
    return cast(attention_factor * np.cos(angles), dtype), cast(attention_factor * np.sin(angles), dtype)


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """RoPE(x) in the half layout, float64: x [N, d], cos/sin [N, d/2] (any dtype) → [N, d].

    x·cat(cos, cos) + rotate_half(x)·cat(sin, sin), rotate_half(x) = cat(−x₂, x₁).
    """
    half = x.shape[1] // 2
    c, s = cos.astype(np.float64), sin.astype(np.float64)
    x1, x2 = x[:, :half], x[:, half:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=1)  # [N, d]


def decay_bound(inv_freq: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """RoFormer's upper bound (1/(d/2)) Σ_{j=1}^{d/2} |S_j|, S_j = Σ_{i<j} e^{i·Δ·θ_i}, per distance Δ.

    inv_freq [d/2], distances [D] → float64 [D]. Evaluated in blocks of distances (the complex
    partial sums are [block, d/2]).
    """
    theta = inv_freq.astype(np.float64)
    out = np.empty(distances.shape[0], dtype=np.float64)
    block = max(1, (1 << 20) // max(theta.size, 1))
    for start in range(0, distances.shape[0], block):
        delta = distances[start:start + block].astype(np.float64)[:, None]  # [b, 1]
        partial = np.cumsum(np.exp(1j * delta * theta[None, :]), axis=1)  # [b, d/2]: S_1 .. S_{d/2}
        out[start:start + block] = np.abs(partial).mean(axis=1)
    return out


def inner_ones(inv_freq: np.ndarray, attention_factor: float, distances: np.ndarray) -> np.ndarray:
    """⟨RoPE(1, m), RoPE(1, m + Δ)⟩ for q = k = ones [d]: Σ_i 2·cos(Δθ_i)·a², independent of m. float64 [D]."""
    theta = inv_freq.astype(np.float64)
    return 2.0 * attention_factor**2 * np.cos(distances.astype(np.float64)[:, None] * theta[None, :]).sum(axis=1)


def pair_distance(inv_freq: np.ndarray, attention_factor: float, distances: np.ndarray) -> np.ndarray:
    """‖row(m) − row(m + Δ)‖ of the full-form [cos | sin] rows in exact arithmetic (depends on Δ only):
    sqrt(Σ_i 2·a²·(2 − 2cos(Δθ_i))). float64 [D]."""
    theta = inv_freq.astype(np.float64)
    angle = distances.astype(np.float64)[:, None] * theta[None, :]  # [D, d/2]
    return np.sqrt(4.0 * attention_factor**2 * (1.0 - np.cos(angle)).sum(axis=1))


@dataclass(frozen=True)
class RopeProperties:
    """Curves (numpy arrays) and scalars of one RoPE table; shapes in `rope_properties`."""

    curves: dict[str, np.ndarray]
    scalars: dict[str, float | int | None]


def context_length(params: RopeParameters, rows: int) -> int:
    """The context a model was trained on: original_max_position_embeddings, else
    max_position_embeddings, else the table's rows."""
    return params.original_max_position_embeddings or params.max_position_embeddings or rows


def rope_properties(params: RopeParameters, rows: int, offset: int, dtype: np.dtype, pairs: int,
                    seed: int) -> RopeProperties:
    """Every RoPE property of the table of positions offset .. offset + rows − 1 served in `dtype`.

    Curves: distance [rows] int64 (0 .. rows − 1); pair_distance, decay_bound, inner_ones [rows] float64;
    adjacent_distance [rows − 1] float64 (served rows); inv_freq, default_inv_freq [d/2] float32;
    wavelength, frequency_scale [d/2] float64; completes_turn [d/2] bool; relativity_position
    [pairs] int64 (max(m, n)), relativity_residual and norm_ratio [pairs] float64.
    """
    cos, sin, info = rope_cos_sin(params, rows, offset, "half", "half", dtype)  # [rows, d/2] each
    inv_freq, factor = info.inv_freq, info.attention_factor
    distances = np.arange(rows, dtype=np.int64)
    wavelength = 2.0 * np.pi / inv_freq.astype(np.float64)
    base_inv_freq = default_inv_freq(params.rope_theta, params.rotary_dim)
    if base_inv_freq.size != inv_freq.size:  # proportional: the rotated part first, then zero frequencies
        base_inv_freq = np.concatenate([base_inv_freq, np.zeros(inv_freq.size - base_inv_freq.size, np.float32)])
    with np.errstate(divide="ignore", invalid="ignore"):
        frequency_scale = np.where(inv_freq > 0, base_inv_freq.astype(np.float64) / inv_freq, np.nan)
    context = context_length(params, rows)
    pairs_curve = pair_distance(inv_freq, factor, distances)
    served = np.concatenate([cos, sin], axis=1)  # [rows, d]: the distinct values of a full-form row
    adjacent = np.sqrt(2.0) * adjacent_distance(served)  # full form repeats every column once

    rng = np.random.default_rng(seed)
    m = rng.integers(offset, offset + rows, size=pairs)
    n = rng.integers(offset, offset + rows, size=pairs)
    residual, norm_ratio = _relativity_and_norm(inv_freq, factor, m, n, dtype, rng)
    curves = {
        "distance": distances, "pair_distance": pairs_curve, "adjacent_distance": adjacent,
        "decay_bound": decay_bound(inv_freq, distances), "inner_ones": inner_ones(inv_freq, factor, distances),
        "inv_freq": inv_freq, "default_inv_freq": base_inv_freq, "wavelength": wavelength,
        "frequency_scale": frequency_scale, "completes_turn": wavelength <= context,
        "relativity_position": np.maximum(m, n).astype(np.int64), "relativity_residual": residual,
        "norm_ratio": norm_ratio,
    }
    scalars: dict[str, float | int | None] = {
        "attention_factor": factor, "context_length": context,
        "min_pair_distance": float(pairs_curve[1:].min()) if rows > 1 else None,
        "min_pair_distance_at": int(np.argmin(pairs_curve[1:]) + 1) if rows > 1 else None,
        "min_adjacent_distance": float(adjacent.min()) if rows > 1 else None,
        "first_collision_position": _position(first_collision_position(served), offset),
        "relativity_max_residual": float(residual.max()),
        "norm_max_deviation": float(np.max(np.abs(norm_ratio - 1.0))),
        "turning_dimensions": int(np.count_nonzero(wavelength <= context)),
        **rope_equivariance(inv_freq, factor, offset, min(rows, EQUIVARIANCE_TOKENS), seed),
    }
    return RopeProperties(curves, scalars)


def _position(index: int | None, offset: int) -> int | None:
    return None if index is None else offset + index


def _relativity_and_norm(inv_freq: np.ndarray, factor: float, m: np.ndarray, n: np.ndarray, dtype: np.dtype,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Relative residual |⟨R(q,m), R(k,n)⟩ − a·⟨q, R(k, n−m)⟩| / (a²‖q‖‖k‖) and ‖R(q,m)‖ / (a‖q‖), served rows."""
    width = 2 * inv_freq.size
    q = rng.standard_normal((m.size, width))  # [pairs, d]
    k = rng.standard_normal((m.size, width))
    q_m = rotate(q, *rope_rows(inv_freq, factor, m, dtype))
    k_n = rotate(k, *rope_rows(inv_freq, factor, n, dtype))
    k_rel = rotate(k, *rope_rows(inv_freq, factor, n - m, dtype))
    norm_ratio = np.linalg.norm(q_m, axis=1) / np.where(factor > 0, factor * np.linalg.norm(q, axis=1), 1.0)
    return relativity_residual(q, k, q_m, k_n, k_rel, factor), norm_ratio


def relativity_residual(q: np.ndarray, k: np.ndarray, q_m: np.ndarray, k_n: np.ndarray, k_rel: np.ndarray,
                        factor: float) -> np.ndarray:
    """|⟨q_m, k_n⟩ − a·⟨q, k_rel⟩| / (a²‖q‖‖k‖) per pair: q_m = R(q, m), k_n = R(k, n), k_rel = R(k, n − m),
    all [pairs, d] → float64 [pairs] (0 where RoPE is exactly relative)."""
    lhs = np.einsum("pd,pd->p", q_m, k_n)
    rhs = factor * np.einsum("pd,pd->p", q, k_rel)
    scale = factor**2 * np.linalg.norm(q, axis=1) * np.linalg.norm(k, axis=1)
    return np.abs(lhs - rhs) / np.where(scale > 0, scale, 1.0)


def rope_equivariance(inv_freq: np.ndarray, factor: float, offset: int, tokens: int,
                      seed: int) -> dict[str, float | int | None]:
    """Permutation equivariance of attention over `tokens` random q/k/v (float64), three ways:
    without positions (equivariant: ≈ 0), with RoPE at fixed slots (positions stay while tokens move:
    not equivariant) and with RoPE positions moving with their tokens (equivariant again)."""
    rng = np.random.default_rng(seed + 1)
    width = 2 * inv_freq.size
    q, k, v = (rng.standard_normal((tokens, width)) for _ in range(3))  # [S, d] each
    permutation = rng.permutation(tokens)
    positions = np.arange(offset, offset + tokens)

    def attend(order: np.ndarray, slot_positions: np.ndarray) -> np.ndarray:
        # token order[i] sits in slot i at position slot_positions[i]
        c, s = rope_rows(inv_freq, factor, slot_positions, np.dtype(np.float64))  # [S, d/2]
        return attention(rotate(q[order], c, s), rotate(k[order], c, s), v[order])

    identity = np.arange(tokens)
    direct = attend(identity, positions)[permutation]
    fixed = attend(permutation, positions)
    moving = attend(permutation, positions[permutation])
    return {
        "equivariance_tokens": tokens,
        "equivariance_no_position": permutation_residual(q, k, v, permutation),
        "equivariance_rope_fixed_positions": float(np.max(np.abs(fixed - direct))),
        "equivariance_rope_moving_positions": float(np.max(np.abs(moving - direct))),
    }


