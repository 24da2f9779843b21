"""Properties of the relative-position index tables (DeBERTa log buckets, Shaw et al.'s clipped indices):
the index as a function of the signed offset, which offsets collapse into one index, the sign
convention and symmetry, and the Toeplitz property of the served [query, key] table."""

import numpy as np

TOEPLITZ_BLOCK = 1 << 20  # table cells compared at once (bounds the temporaries)


def index_curve_properties(offsets: np.ndarray, index: np.ndarray) -> tuple[dict[str, np.ndarray],
                                                                            dict[str, int | str | None]]:
    """Uniqueness and symmetry of an index against key − query offset.

    offsets: int64 [R] ascending and contiguous (containing 0); index: integer [R] (index[t] of offset
    offsets[t]). Curves: offsets_per_index int64 [R] (how many offsets of the table share each offset's
    index) and boundaries int64 [B] (offsets whose index differs from the previous offset's). Scalars:
    indices_used, boundaries, exact_up_to (largest D with |index(r) − index(0)| = |r| for every |r| ≤ D),
    first_shared_distance (smallest |r| whose index another offset shares), largest_index_share,
    clip_left / clip_right (the offsets from which the index stays that of the table's first / last offset),
    sign_convention (the index grows with "key − query" or "query − key") and symmetry_max_violation
    (max |index(r) + index(−r) − 2·index(0)|: 0 when the index is odd about index(0)).
    """
    values = index.astype(np.int64)
    zero = int(np.flatnonzero(offsets == 0)[0])
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    per_offset = counts[inverse].astype(np.int64)  # [R]
    boundaries = offsets[np.flatnonzero(np.diff(values) != 0) + 1]
    distance = np.abs(offsets)
    exact = np.abs(values - values[zero]) == distance
    inexact = distance[~exact]
    exact_up_to = int(inexact.min()) - 1 if inexact.size else int(distance.max())
    shared = distance[per_offset > 1]
    left = int(offsets[np.flatnonzero(values != values[0])[0] - 1]) if (values != values[0]).any() else None
    right_change = np.flatnonzero(values != values[-1])
    right = int(offsets[right_change[-1] + 1]) if right_change.size else None
    mirrored = min(zero, values.size - 1 - zero)  # offsets r with −r also in the table
    symmetric = values[zero - mirrored:zero + mirrored + 1]
    violation = int(np.max(np.abs(symmetric + symmetric[::-1] - 2 * values[zero])))
    sign = _sign_convention(values, zero)
    scalars: dict[str, int | str | None] = {
        "indices_used": int(counts.size), "boundaries": int(boundaries.size), "exact_up_to": exact_up_to,
        "first_shared_distance": int(shared.min()) if shared.size else None,
        "largest_index_share": int(counts.max()), "clip_left": left, "clip_right": right,
        "sign_convention": sign, "symmetry_max_violation": violation,
    }
    return {"offsets_per_index": per_offset, "boundaries": boundaries}, scalars


def _sign_convention(values: np.ndarray, zero: int) -> str | None:
    """Which offset the index grows with, read at offset ±1 (None: the table has neither neighbour of 0)."""
    if zero + 1 < values.size:
        step = values[zero + 1] - values[zero]
    elif zero > 0:
        step = values[zero] - values[zero - 1]
    else:
        return None
    return "key − query" if step > 0 else "query − key" if step < 0 else None


def toeplitz_violation(table: np.ndarray, per_offset: np.ndarray) -> int:
    """max |table[i, j] − per_offset[j − i + q − 1]| over the whole served table (0: the table depends on
    j − i only and is laid out from `per_offset`). table: integer [q, k]; per_offset: [q + k − 1].
    Compared in blocks of rows (int64 temporaries of about `TOEPLITZ_BLOCK` cells)."""
    rows, columns = table.shape
    per = per_offset.astype(np.int64)
    step = max(1, TOEPLITZ_BLOCK // columns)
    worst = 0
    for start in range(0, rows, step):
        i = np.arange(start, min(start + step, rows))[:, None]  # [b, 1]
        expected = per[np.arange(columns)[None, :] - i + rows - 1]  # [b, k]
        worst = max(worst, int(np.max(np.abs(table[start:start + step].astype(np.int64) - expected))))
    return worst
