"""DeBERTa-v2/v3 log-bucketed relative positions.

Reference: Hugging Face transformers 5.23.0 `models/deberta_v2/modeling_deberta_v2.py`,
`make_log_bucket_position` and `build_relative_position` (from microsoft/DeBERTa).
Sign convention is query − key, the opposite of T5.
"""


import numpy as np

from posenc.models.dtypes import IntDType, cast, np_dtype
from posenc.models.errors import ParameterError
from posenc.models.relative import check_lengths, key_minus_query, toeplitz

# DeBERTa-v3's config.json: position_buckets 256, max_relative_positions -1 (= max_position_embeddings, 512)
DEFAULT_DEBERTA_POSITION_BUCKETS = 256
DEFAULT_DEBERTA_MAX_RELATIVE_POSITIONS = 512


def check_deberta_parameters(position_buckets: int, max_relative_positions: int) -> None:
    """Reject settings where the log branch is 0/0 or decreasing: need mid >= 1 and (max − 1) / mid > 1."""
    if position_buckets < 2:
        raise ParameterError("position_buckets", f"must be >= 2, got {position_buckets}")
    mid = position_buckets // 2
    if max_relative_positions - 1 <= mid:
        raise ParameterError(
            "max_relative_positions",
            f"must be > position_buckets // 2 + 1 = {mid + 1} so that "
            f"log((max_relative_positions − 1) / mid) > 0; got {max_relative_positions}",
        )


def deberta_log_bucket_position(
    relative_position: np.ndarray,
    position_buckets: int = DEFAULT_DEBERTA_POSITION_BUCKETS,
    max_relative_positions: int = DEFAULT_DEBERTA_MAX_RELATIVE_POSITIONS,
) -> np.ndarray:
    """Bit-exact `make_log_bucket_position(rel, bucket_size, max_position)`, returned as int64.

    relative_position: integer array (query − key), any shape. |rel| <= mid = position_buckets // 2
    is kept; beyond it, sign · (ceil(log(|rel| / mid) / log((max − 1) / mid) · (mid − 1)) + mid).
    Not clamped, as the reference: |rel| >= max_relative_positions exceeds position_buckets − 1.
    Arithmetic follows the reference's float32 tensors: |rel| / mid rounded to float32, the logs
    are correctly rounded float32, the quotient, product and ceil are float32 operations.
    """
    check_deberta_parameters(position_buckets, max_relative_positions)
    rel = np.asarray(relative_position, dtype=np.int64)
    mid = position_buckets // 2
    magnitude = np.abs(rel)
    # the log branch only survives for |rel| > mid; evaluating it on max(|rel|, mid) elsewhere keeps
    # it finite (the reference substitutes mid − 1, which is log(0) when mid = 1)
    ratio = np.maximum(magnitude, mid).astype(np.float32) / np.float32(mid)
    log_ratio = _log_float32(ratio)
    log_span = _log_float32(np.float32((max_relative_positions - 1) / mid))
    log_pos = np.ceil(log_ratio / log_span * np.float32(mid - 1)) + np.float32(mid)
    bucket = np.where(magnitude <= mid, rel, np.sign(rel) * log_pos.astype(np.int64))
    return bucket.astype(np.int64)


def _log_float32(x: np.ndarray | np.float32) -> np.ndarray:
    """Natural log of positive float32 values, correctly rounded to float32."""
    return np.log(np.asarray(x, dtype=np.float64)).astype(np.float32)


def deberta_buckets(
    query_length: int,
    key_length: int,
    position_buckets: int = DEFAULT_DEBERTA_POSITION_BUCKETS,
    max_relative_positions: int = DEFAULT_DEBERTA_MAX_RELATIVE_POSITIONS,
    dtype: IntDType = "int64",
) -> np.ndarray:
    """`build_relative_position(q, k, bucket_size, max_position)[0]`: [query_length, key_length].

    bucket_size = position_buckets, max_position = max_relative_positions (the microsoft/DeBERTa
    order). Entry [i, j] is the log bucket of i − j. Returns `dtype` (int64 default).
    """
    check_lengths(query_length, key_length)
    check_deberta_parameters(position_buckets, max_relative_positions)
    query_minus_key = -key_minus_query(query_length, key_length)  # [q + k − 1]
    per_offset = deberta_log_bucket_position(query_minus_key, position_buckets, max_relative_positions)
    return toeplitz(cast(per_offset, np_dtype(dtype)), query_length, key_length)


