"""T5 relative-position buckets and the learned bias they index.

Reference: Hugging Face transformers 5.23.0 `models/t5/modeling_t5.py`,
`T5Attention._relative_position_bucket` and `T5Attention.compute_bias` (from Mesh-TF
`transformer_layers.py`). Same math in mT5, UMT5, LongT5, Switch, Pix2Struct, Pop2Piano, UDOP.
"""

import math

import numpy as np

from posenc.models.dtypes import IntDType, cast, np_dtype
from posenc.models.errors import ParameterError
from posenc.models.relative import check_lengths, head_blocks, key_minus_query, toeplitz, toeplitz_heads_view

# T5Config's relative_attention_num_buckets and relative_attention_max_distance
DEFAULT_T5_NUM_BUCKETS = 32
DEFAULT_T5_MAX_DISTANCE = 128


def _effective_buckets(bidirectional: bool, num_buckets: int) -> int:
    """Buckets per direction: the reference floors num_buckets / 2 when bidirectional.

    An odd num_buckets in bidirectional mode is accepted and follows the reference exactly:
    bucket num_buckets − 1 is never produced (its row of the learned table is unused).
    """
    return num_buckets // 2 if bidirectional else num_buckets


def check_t5_parameters(bidirectional: bool, num_buckets: int, max_distance: int, offset: int = 0) -> None:
    """Reject settings for which the reference formula is undefined (log of a ratio <= 1, or 0/0)."""
    per_direction = _effective_buckets(bidirectional, num_buckets)
    max_exact = per_direction // 2
    if max_exact < 1:
        least = 4 if bidirectional else 2
        raise ParameterError(
            "num_buckets",
            f"must be >= {least} when bidirectional={str(bidirectional).lower()} "
            f"(got {num_buckets}, which leaves no exact bucket)",
        )
    if max_distance <= max_exact:
        raise ParameterError(
            "max_distance",
            f"must be > {max_exact} (the exact-bucket range num_buckets/{4 if bidirectional else 2}) "
            f"so that log(max_distance / max_exact) > 0; got {max_distance}",
        )
    if offset < 0:
        raise ParameterError("offset", f"must be >= 0 (number of past tokens), got {offset}")


def t5_relative_position_bucket(
    relative_position: np.ndarray,
    bidirectional: bool = True,
    num_buckets: int = DEFAULT_T5_NUM_BUCKETS,
    max_distance: int = DEFAULT_T5_MAX_DISTANCE,
) -> np.ndarray:
    """Bucket of each key − query offset, bit-exact with `T5Attention._relative_position_bucket`.

    relative_position: integer array of any shape (memory position − query position).
    Returns int64 of the same shape, values in [0, num_buckets).

    The log branch follows the reference's float32 rule: n / max_exact and its log in float32
    (the log is the correctly rounded float32 of the exact value), divided by float32
    log(max_distance / max_exact), times (num_buckets − max_exact) in float32, then truncated.
    Evaluating it in float64 instead moves some boundaries by one bucket.
    """
    check_t5_parameters(bidirectional, num_buckets, max_distance)
    rel = np.asarray(relative_position, dtype=np.int64)
    per_direction = _effective_buckets(bidirectional, num_buckets)
    if bidirectional:
        # future keys (rel > 0) use the upper half of the buckets
        upper = np.where(rel > 0, per_direction, 0).astype(np.int64)
        n = np.abs(rel)
    else:
        # causal: future offsets collapse onto n = 0, the diagonal's bucket (the mask hides them)
        upper = np.zeros_like(rel)
        n = np.maximum(-rel, 0)
    max_exact = per_direction // 2
    is_small = n < max_exact
    # guard: the reference evaluates log(0) = −inf here and discards it with `where`
    ratio = np.maximum(n, max_exact).astype(np.float32) / np.float32(max_exact)
    log32 = np.log(ratio.astype(np.float64)).astype(np.float32)
    scaled = log32 / np.float32(math.log(max_distance / max_exact)) * np.float32(per_direction - max_exact)
    large = np.minimum(max_exact + scaled.astype(np.int64), per_direction - 1)
    return upper + np.where(is_small, n, large)


def t5_buckets(
    query_length: int,
    key_length: int,
    bidirectional: bool = True,
    num_buckets: int = DEFAULT_T5_NUM_BUCKETS,
    max_distance: int = DEFAULT_T5_MAX_DISTANCE,
    offset: int = 0,
    dtype: IntDType = "int64",
) -> np.ndarray:
    """Bucket table [query_length, key_length] of key − query, query i at absolute position offset + i.

    Equals `_relative_position_bucket(memory − context)` as `compute_bias(q, k, past_seen_tokens=offset)`
    builds it; `bidirectional=False` is the decoder (causal) setting. Returns `dtype` (int64 default).
    """
    check_lengths(query_length, key_length)
    check_t5_parameters(bidirectional, num_buckets, max_distance, offset)
    offsets = key_minus_query(query_length, key_length) - offset  # [q + k − 1], key − query
    per_offset = t5_relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    return toeplitz(cast(per_offset, np_dtype(dtype)), query_length, key_length)


def check_t5_weight_shape(shape: tuple[int, ...], num_buckets: int) -> None:
    """The learned table must be [num_buckets, num_heads] with at least one head."""
    if len(shape) != 2 or shape[1] < 1:
        raise ParameterError("weight", f"must be 2-D [num_buckets, num_heads >= 1], got shape {list(shape)}")
    if shape[0] != num_buckets:
        raise ParameterError(
            "weight", f"has {shape[0]} rows but num_buckets={num_buckets}; expected [{num_buckets}, num_heads]"
        )


def t5_bias(
    weight: np.ndarray,
    query_length: int,
    key_length: int,
    bidirectional: bool = True,
    num_buckets: int = DEFAULT_T5_NUM_BUCKETS,
    max_distance: int = DEFAULT_T5_MAX_DISTANCE,
    offset: int = 0,
) -> np.ndarray:
    """Learned relative bias [num_heads, query_length, key_length], in the weight's dtype.

    weight: the `relative_attention_bias` embedding table [num_buckets, num_heads], any dtype. Equals
    `compute_bias(q, k, past_seen_tokens=offset)[0]` (an exact gather; no arithmetic on the weight).

    Work is O(num_heads · (q · k + q + k)) whatever the split between heads and lengths: the table is
    gathered per (head, offset) and laid out by strided copies, a block of heads at a time
    (`head_blocks`). Peak memory is the output plus a block's gather [q + k − 1, block] and its
    transpose: 2 · O(PER_OFFSET_BLOCK + q + k) values of the weight's dtype, whatever num_heads (the
    [num_heads, q + k − 1] gather of all heads would be as large as the output when q = 1 or k = 1).
    The weight itself is neither copied nor transposed.
    """
    check_t5_weight_shape(weight.shape, num_buckets)
    check_lengths(query_length, key_length)
    check_t5_parameters(bidirectional, num_buckets, max_distance, offset)
    offsets = key_minus_query(query_length, key_length) - offset  # [q + k − 1], key − query
    per_offset = t5_relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    out = np.empty((weight.shape[1], query_length, key_length), dtype=weight.dtype)
    # the bias is Toeplitz too: gather per offset, then lay out rows (no [q, k] index table)
    for heads in head_blocks(weight.shape[1], query_length, key_length):
        # heads on the first axis, offsets contiguous: the layout copy then reads whole rows
        values = np.ascontiguousarray(weight[per_offset, heads].T)  # [block, q + k − 1]
        out[heads] = toeplitz_heads_view(values, query_length, key_length)  # [block, q, k]
    return out
