"""Measurements every family shares: row distances, exact collisions, attention without positions."""

import numpy as np

from posenc.models.errors import ParameterError

MAX_PROPERTY_ROWS = 1 << 16  # positions a property curve spans (work is O(rows · width))
MAX_PAIRS = 1 << 16  # random (m, n) pairs of a residual measurement
MAX_PROPERTY_ELEMENTS = 1 << 24  # positions × width (and pairs × width) evaluated in float64 at once


def check_rows(name: str, rows: int) -> None:
    """Properties are curves over every position: bound the positions before any work."""
    if rows > MAX_PROPERTY_ROWS:
        raise ParameterError(name, f"properties are measured on at most {MAX_PROPERTY_ROWS} positions, got {rows}")


def check_work(rows: int, pairs: int, width: int, width_name: str, rows_name: str = "max_position") -> None:
    """Curves over rows × width and residuals over pairs × width values: bounded before any work."""
    for name, count in ((rows_name, rows), ("pairs", pairs)):
        if count * width > MAX_PROPERTY_ELEMENTS:
            raise ParameterError(name, f"{name} × {width_name} must be at most {MAX_PROPERTY_ELEMENTS} for the "
                                       f"properties, got {count} × {width}")


def adjacent_distance(table: np.ndarray) -> np.ndarray:
    """‖T[p+1] − T[p]‖ for every p, the rows taken as served (any dtype) and subtracted in float64.

    table: [P, d] → float64 [P − 1]. Where a low-precision dtype rounds two neighbours to the same
    values the distance is exactly 0.
    """
    rows = table.astype(np.float64)  # [P, d]
    return np.sqrt(np.sum(np.square(np.diff(rows, axis=0)), axis=1))  # [P − 1]


def first_collision_position(table: np.ndarray) -> int | None:
    """The first row index whose bytes equal an earlier row's (None: all rows distinct).

    table: [P, d] in the served dtype; exact comparison of the stored values, O(P · d).
    """
    rows = np.ascontiguousarray(table)
    seen: set[bytes] = set()
    for index in range(rows.shape[0]):
        key = rows[index].tobytes()
        if key in seen:
            return index
        seen.add(key)
    return None


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """softmax(q kᵀ / √d) v without a mask, float64. q, k, v: [S, d] → [S, d]."""
    scores = q @ k.T / np.sqrt(q.shape[1])  # [S, S]
    scores -= scores.max(axis=1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights @ v  # [S, d]


def permutation_residual(q: np.ndarray, k: np.ndarray, v: np.ndarray, permutation: np.ndarray) -> float:
    """max |Attn(Pq, Pk, Pv) − P·Attn(q, k, v)|: 0 (up to summation order) when attention is
    permutation-equivariant. q, k, v: [S, d]; permutation: [S] indices."""
    direct = attention(q, k, v)[permutation]  # [S, d]
    permuted = attention(q[permutation], k[permutation], v[permutation])  # [S, d]
    return float(np.max(np.abs(permuted - direct)))
