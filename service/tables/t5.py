"""T5 relative-position buckets and the bias of an uploaded learned table (docs/ENCODINGS.md §3)."""

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import Field

from posenc.models.bounds import MAX_BUCKETS, MAX_DISTANCE, MAX_OFFSET, MAX_SEQUENCE
from posenc.models.dtypes import cast, dtype_name, np_dtype
from posenc.models.t5 import (
    DEFAULT_T5_MAX_DISTANCE,
    DEFAULT_T5_NUM_BUCKETS,
    check_t5_parameters,
    check_t5_weight_shape,
    t5_bias,
    t5_buckets,
)
from posenc.service.codec.encode import Bundle, byte_view
from posenc.service.tables.fields import IntDTypeField
from posenc.service.tables.registry import TableQuery, TensorSpec, float_upload, register_table

BiasDType = Literal["weight", "float32", "float16", "bfloat16", "float64"]


class T5Query(TableQuery):
    """The geometry both T5 routes share, checked together before anything else happens."""

    preset_table = "t5"

    query_length: int = Field(ge=1, le=MAX_SEQUENCE, description=(
        "Number of query rows; row i is the query at absolute position offset + i."))
    key_length: int = Field(ge=1, le=MAX_SEQUENCE, description="Number of key columns (positions 0..).")
    bidirectional: bool = Field(True, description=(
        "true: encoder (future keys use the upper half of the buckets); false: decoder/causal (every "
        "future key shares the diagonal's bucket 0)."))
    num_buckets: int = Field(DEFAULT_T5_NUM_BUCKETS, ge=2, le=MAX_BUCKETS, description=(
        "relative_attention_num_buckets. As in transformers, bidirectional mode uses num_buckets // 2 per "
        "direction: an odd count is accepted and its last bucket is never produced. Needs >= 4 "
        "(bidirectional) or >= 2 (causal)."))
    max_distance: int = Field(DEFAULT_T5_MAX_DISTANCE, ge=1, le=MAX_DISTANCE, description=(
        "relative_attention_max_distance: where the log-spaced buckets would reach num_buckets. Must "
        "exceed max_exact = num_buckets/4 (bidirectional) or num_buckets/2 (causal)."))
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description=(
        "Past tokens: query positions start here (compute_bias's past_seen_tokens)."))

    def check(self) -> None:
        check_t5_parameters(self.bidirectional, self.num_buckets, self.max_distance, self.offset)

    def geometry(self) -> dict[str, Any]:
        """Keyword arguments of `t5_buckets` / `t5_bias` besides the weight and the dtype."""
        return self.model_dump(include={"query_length", "key_length", "bidirectional", "num_buckets",
                                        "max_distance", "offset"})


class T5BucketsQuery(T5Query):
    """Bit-exact `T5Attention._relative_position_bucket(key − query)` (float32 log, then truncation)."""

    endpoint = "t5/buckets"
    tensors = ("buckets",)

    dtype: IntDTypeField = "int64"

    def specs(self) -> dict[str, TensorSpec]:
        return {"buckets": TensorSpec((self.query_length, self.key_length), np_dtype(self.dtype))}

    def compute(self) -> Bundle:
        return Bundle({"buckets": t5_buckets(**self.geometry(), dtype=self.dtype)})


WEIGHT_BODY = float_upload("weight", "The learned table `weight` [num_buckets, num_heads] (F64/F32/F16/BF16) as "
                           "safetensors (tensor `weight`, or the only tensor) or .npy (no pickle).")


class T5BiasQuery(T5Query):
    """`T5Attention.compute_bias(q, k, past_seen_tokens=offset)[0]` with the uploaded weight."""

    endpoint = "t5/bias"
    tensors = ("bias",)
    body = WEIGHT_BODY

    dtype: BiasDType = Field("weight", description=(
        "Element type of `bias`; `weight` (default) keeps the uploaded weight's dtype. The gather is "
        "exact, so any other choice equals casting the weight."))

    @property
    def weight(self) -> np.ndarray:
        upload: np.ndarray = self.upload
        return upload

    def out_dtype(self) -> np.dtype:
        return self.weight.dtype if self.dtype == "weight" else np_dtype(self.dtype)

    def check(self) -> None:
        super().check()
        if self.upload is not None:
            check_t5_weight_shape(self.weight.shape, self.num_buckets)

    def params(self) -> dict[str, Any]:
        weight = self.weight
        return {**self.geometry(), "dtype": dtype_name(self.out_dtype()), "weight_shape": list(weight.shape),
                "weight_dtype": dtype_name(weight.dtype),
                # hashed in place: the decoded weight is C-contiguous, its bytes need no copy
                "weight_sha256": hashlib.sha256(byte_view(weight)).hexdigest()}

    def specs(self) -> dict[str, TensorSpec]:
        return {"bias": TensorSpec((self.weight.shape[1], self.query_length, self.key_length), self.out_dtype())}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        return super().working_bytes(specs) + self.weight.nbytes  # + the weight cast to the output dtype

    def compute(self) -> Bundle:
        # casting the table first equals casting the gathered bias, at a fraction of the memory
        return Bundle({"bias": t5_bias(cast(self.weight, self.out_dtype()), **self.geometry())})


register_table("/v1/t5/buckets", T5BucketsQuery, summary="T5 relative-position buckets of key − query",
               response_description="Tensor `buckets` [query_length, key_length].")
register_table("/v1/t5/bias", T5BiasQuery, summary="T5 relative-position bias from an uploaded learned table",
               response_description="Tensor `bias` [num_heads, query_length, key_length].")
