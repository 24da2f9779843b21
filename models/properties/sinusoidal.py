"""Sinusoidal table properties (Vaswani et al. 2017 §3.5): uniqueness, relativity PE(p+k) = M_k·PE(p)
with M_k a block rotation independent of p, and the dot product PE(m)·PE(n) against m − n."""

from dataclasses import dataclass

import numpy as np

from posenc.models.properties.measures import adjacent_distance, first_collision_position
from posenc.models.sinusoidal import SinusoidalVariant, log_spaced_frequencies, paper_frequencies, sinusoidal_table


@dataclass(frozen=True)
class SinCosPairs:
    """Which columns hold sin(p·ω_i) and cos(p·ω_i) for each frequency ω_i (an odd dim's unpaired
    column is left out)."""

    sin_columns: np.ndarray  # int64 [F]
    cos_columns: np.ndarray  # int64 [F]
    omega: np.ndarray  # float64 [F]


def sincos_pairs(dim: int, variant: SinusoidalVariant, base: float) -> SinCosPairs:
    """The (sin, cos) column pairs of a `sinusoidal_table` layout (docs/ENCODINGS.md §6)."""
    count = dim // 2
    index = np.arange(count, dtype=np.int64)
    if variant == "paper":
        return SinCosPairs(2 * index, 2 * index + 1, paper_frequencies(count, dim, base))
    if variant == "marian":
        return SinCosPairs(index, (dim + 1) // 2 + index, paper_frequencies(count, dim, base))
    return SinCosPairs(index, count + index, log_spaced_frequencies(count, base, guard=variant == "tensor2tensor"))


def shift(rows: np.ndarray, pairs: SinCosPairs, k: np.ndarray) -> np.ndarray:
    """M_k·PE(p) for each row: every (sin, cos) pair rotated by k·ω_i (float64).

    rows [N, dim] (any dtype), k [N] → float64 [N, 2F] as [sin columns | cos columns].
    sin(a + b) = sin a·cos b + cos a·sin b;  cos(a + b) = cos a·cos b − sin a·sin b.
    """
    s, c = rows[:, pairs.sin_columns].astype(np.float64), rows[:, pairs.cos_columns].astype(np.float64)
    angle = k.astype(np.float64)[:, None] * pairs.omega[None, :]  # [N, F]
    return np.concatenate([s * np.cos(angle) + c * np.sin(angle), c * np.cos(angle) - s * np.sin(angle)], axis=1)


def shift_residual(source: np.ndarray, target: np.ndarray, pairs: SinCosPairs, k: np.ndarray) -> np.ndarray:
    """‖target − M_k·source‖ / ‖target‖ per row, on the (sin, cos) pairs only (float64).

    source, target: [N, dim] rows (any dtype) k positions apart; k: [N] → float64 [N].
    """
    wanted = np.concatenate([target[:, pairs.sin_columns], target[:, pairs.cos_columns]], axis=1).astype(np.float64)
    norm = np.linalg.norm(wanted, axis=1)
    return np.linalg.norm(shift(source, pairs, k) - wanted, axis=1) / np.where(norm > 0, norm, 1.0)


@dataclass(frozen=True)
class SinusoidalProperties:
    curves: dict[str, np.ndarray]
    scalars: dict[str, float | int | None]


def sinusoidal_properties(rows: int, dim: int, variant: SinusoidalVariant, base: float, offset: int,
                          padding_idx: int, dtype: np.dtype, pairs: int, seed: int) -> SinusoidalProperties:
    """Properties of the table of positions offset .. offset + rows − 1 served in `dtype`.

    Curves: distance [rows] int64; pair_distance and dot_product [rows] float64 (‖PE(0) − PE(Δ)‖ and
    PE(0)·PE(Δ) of the exact table, which depend on Δ only; fairseq's zeroed padding row is left out);
    adjacent_distance [rows − 1] (served rows); omega [F] float64; relativity_position [pairs] int64
    (p + k) and relativity_residual [pairs] float64 (‖PE(p+k) − M_k·PE(p)‖ / ‖PE(p+k)‖, served rows; NaN where fairseq's
    padding row is one end).
    """
    served = sinusoidal_table(rows, dim, variant, base, offset, padding_idx, dtype)  # [rows, dim]
    exact = sinusoidal_table(rows, dim, variant, base, 0, -1, np.float64)  # [rows, dim], no padding row
    distances = np.arange(rows, dtype=np.int64)
    pair_curve = np.linalg.norm(exact - exact[0], axis=1)  # [rows]
    dot = exact @ exact[0]  # [rows]
    adjacent = adjacent_distance(served)
    columns = sincos_pairs(dim, variant, base)

    rng = np.random.default_rng(seed)
    p = rng.integers(0, rows, size=pairs)
    k = rng.integers(0, rows - p)  # p + k stays inside the table
    residual = shift_residual(served[p], served[p + k], columns, k)
    if variant == "fairseq":  # the zeroed padding row is no sinusoid: pairs touching it measure nothing (NaN)
        residual[(offset + p == padding_idx) | (offset + p + k == padding_idx)] = np.nan

    curves = {"distance": distances, "pair_distance": pair_curve, "dot_product": dot,
              "adjacent_distance": adjacent, "omega": columns.omega,
              "relativity_position": (offset + p + k).astype(np.int64), "relativity_residual": residual}
    collision = first_collision_position(served)
    scalars: dict[str, float | int | None] = {
        "min_pair_distance": float(pair_curve[1:].min()) if rows > 1 else None,
        "min_pair_distance_at": int(np.argmin(pair_curve[1:]) + 1) if rows > 1 else None,
        "min_adjacent_distance": float(adjacent.min()) if rows > 1 else None,
        "first_collision_position": None if collision is None else offset + collision,
        "relativity_max_residual": float(np.nanmax(residual)) if np.isfinite(residual).any() else None,
        "relativity_pairs": int(np.count_nonzero(np.isfinite(residual))),
    }
    return SinusoidalProperties(curves, scalars)
