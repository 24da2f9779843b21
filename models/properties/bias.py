"""Long-range decay of the additive biases: what each head adds to a logit against the distance to
the key (ALiBi, Press et al. 2022; T5, Raffel et al. 2020 §2.1), and T5's bucket boundaries."""

import numpy as np

from posenc.models.alibi import AlibiMode, alibi_bias, alibi_slopes, bloom_slopes, mpt_slopes
from posenc.models.dtypes import FloatDType
from posenc.models.t5 import t5_relative_position_bucket


def alibi_bias_by_offset(num_heads: int, query_length: int, key_length: int, mode: AlibiMode, mask: bool,
                         alibi_bias_max: float, dtype: FloatDType) -> tuple[np.ndarray, np.ndarray]:
    """The bias each head adds against key − query offset r, read off the served table: its last row
    for r = −(key_length − 1) .. 0 (keys behind the last query) and its last column for r = 1 ..
    query_length − 1 (keys after earlier queries; −inf where masked). For causal and symmetric, whose
    tables depend on r only, that is the whole table; bloom and mpt depend on the key alone.

    Returns offsets int64 [q + k − 1] and the biases `dtype` [num_heads, q + k − 1].
    """
    table = alibi_bias(num_heads, query_length, key_length, mode, mask, alibi_bias_max, dtype)  # [H, q, k]
    last_row = table[:, -1, :]  # key − query = j − (k − 1): −(k − 1) .. 0
    last_column = table[:, :-1, -1][:, ::-1]  # rows q − 2 .. 0: offsets 1 .. q − 1
    offsets = np.arange(-(key_length - 1), query_length, dtype=np.int64)
    return offsets, np.ascontiguousarray(np.concatenate([last_row, last_column], axis=1))


def alibi_mode_slopes(num_heads: int, mode: AlibiMode, alibi_bias_max: float) -> np.ndarray:
    """The slopes a mode multiplies by (float64 [num_heads]): the paper's in float64 for causal and
    symmetric, BLOOM's and MPT's float32 ones for bloom and mpt."""
    if mode == "bloom":
        return bloom_slopes(num_heads, alibi_bias_max).astype(np.float64)
    if mode == "mpt":
        return mpt_slopes(num_heads, alibi_bias_max).astype(np.float64)
    return alibi_slopes(num_heads, alibi_bias_max)


def t5_bucket_curve(relative_positions: np.ndarray, bidirectional: bool, num_buckets: int,
                    max_distance: int) -> tuple[np.ndarray, np.ndarray]:
    """Bucket of each key − query offset, and the offsets where a new bucket starts (the boundaries).

    relative_positions: int64 [R] ascending → buckets int64 [R], boundaries int64 [B] (the offsets
    r whose bucket differs from that of r − 1; the first offset excluded).
    """
    buckets = t5_relative_position_bucket(relative_positions, bidirectional, num_buckets, max_distance)
    changes = np.flatnonzero(np.diff(buckets) != 0) + 1
    return buckets, relative_positions[changes]


def t5_bias_by_offset(weight: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """The learned bias each head adds at each offset: weight [num_buckets, H] gathered by the
    buckets [R] → [H, R] in the weight's dtype (an exact gather)."""
    return np.ascontiguousarray(weight[buckets].T)
