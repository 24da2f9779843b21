"""Relative-position tables shared by the bias families, and Shaw et al.'s clipped indices.

Every table here depends on the query row i and key column j only through the offset d = j − i,
so it is a Toeplitz matrix: we evaluate the encoding once per distinct offset (q + k − 1 values)
and lay the rows out with a sliding window. Memory is the output plus O(q + k). Per-head biases
[num_heads, q, k] do the same for a block of heads at a time (`head_blocks`, `toeplitz_heads_view`),
so neither the head count nor the lengths bring a Python loop per head or a full-size temporary.
"""

from collections.abc import Iterator

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from posenc.models.bounds import MAX_RELATIVE_POSITION
from posenc.models.dtypes import IntDType, cast, np_dtype
from posenc.models.errors import ParameterError

# keeps 2k + 1 inside int32, the narrowest integer dtype served


def check_lengths(query_length: int, key_length: int) -> None:
    """Both lengths must be positive integers (an empty table has no reference meaning)."""
    for name, value in (("query_length", query_length), ("key_length", key_length)):
        if value < 1:
            raise ParameterError(name, f"must be >= 1, got {value}")


def key_minus_query(query_length: int, key_length: int) -> np.ndarray:
    """Every distinct offset d = j − i of a [query_length, key_length] grid, ascending.

    Returns int64 [query_length + key_length − 1]; entry t is d = t − (query_length − 1), the layout
    `toeplitz` expects.
    """
    return np.arange(-(query_length - 1), key_length, dtype=np.int64)


def toeplitz_view(per_offset: np.ndarray, query_length: int, key_length: int) -> np.ndarray:
    """Read-only strided view [query_length, key_length]: out[i, j] = per_offset[j − i + query_length − 1].

    per_offset: [query_length + key_length − 1], indexed as `key_minus_query` lays it out. No copy:
    assign it into a preallocated output, or use `toeplitz` for a contiguous table.
    """
    if per_offset.shape != (query_length + key_length - 1,):
        raise ValueError(f"per_offset has shape {per_offset.shape}, need ({query_length + key_length - 1},)")
    return toeplitz_heads_view(per_offset, query_length, key_length)


def toeplitz_heads_view(per_offset: np.ndarray, query_length: int, key_length: int) -> np.ndarray:
    """`toeplitz_view` over the last axis: [..., q + k − 1] → read-only strided view [..., q, k].

    out[..., i, j] = per_offset[..., j − i + query_length − 1], any dtype and any leading axes (e.g.
    heads), any strides. No copy: assign it into a preallocated output.
    """
    if per_offset.ndim < 1 or per_offset.shape[-1] != query_length + key_length - 1:
        raise ValueError(f"per_offset has shape {per_offset.shape}, need (..., {query_length + key_length - 1})")
    # window s = per_offset[..., s : s + key_length]; row i starts at d = −i, i.e. window q − 1 − i
    windows = sliding_window_view(per_offset, key_length, axis=-1)  # [..., query_length, key_length], rows reversed
    return windows[..., ::-1, :]  # [..., query_length, key_length]


# Per-offset values evaluated at once by the per-head biases (512 KiB as float64). Evaluating all
# heads at once would hold [num_heads, q + k − 1]: with q = 1 or k = 1 as many values as the output,
# in float64 4× a float16 output's bytes, which the service's memory budget does not reserve.
PER_OFFSET_BLOCK = 1 << 16


def head_blocks(num_heads: int, query_length: int, key_length: int) -> Iterator[slice]:
    """Consecutive head ranges covering 0..num_heads, each with about `PER_OFFSET_BLOCK` per-offset values.

    A block holds max(1, PER_OFFSET_BLOCK // (q + k − 1)) heads, so there are at most
    2 · num_heads · (q + k − 1) / PER_OFFSET_BLOCK + 1 blocks, each with at least half a block of work
    (the last one aside): the loop's overhead is a small fraction of the per-offset work whatever the
    split between heads and lengths, and a block's temporaries take O(PER_OFFSET_BLOCK + q + k) memory.
    """
    step = max(1, PER_OFFSET_BLOCK // (query_length + key_length - 1))
    for start in range(0, num_heads, step):
        yield slice(start, min(start + step, num_heads))


def toeplitz(per_offset: np.ndarray, query_length: int, key_length: int) -> np.ndarray:
    """`toeplitz_view` as a new C-order array [query_length, key_length]."""
    return np.ascontiguousarray(toeplitz_view(per_offset, query_length, key_length))


def clipped_relative_indices(
    query_length: int,
    key_length: int,
    max_relative_position: int,
    dtype: IntDType = "int64",
) -> np.ndarray:
    """Shaw et al. (2018, arXiv:1803.02155 §3.2) embedding indices clip(j − i, −k, k) + k.

    Key minus query, both positions counted from 0; values in [0, 2k], i.e. rows of a
    [2k + 1, dim] relative embedding table. Returns [query_length, key_length] in `dtype`.
    """
    check_lengths(query_length, key_length)
    if not 0 <= max_relative_position <= MAX_RELATIVE_POSITION:
        raise ParameterError(
            "max_relative_position", f"must be in [0, {MAX_RELATIVE_POSITION}], got {max_relative_position}"
        )
    k = max_relative_position
    per_offset = np.clip(key_minus_query(query_length, key_length), -k, k) + k  # [q + k_len − 1]
    return toeplitz(cast(per_offset, np_dtype(dtype)), query_length, key_length)
