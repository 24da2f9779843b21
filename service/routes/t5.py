"""GET /v1/t5/buckets and POST /v1/t5/bias: T5 relative-position buckets and bias (ENCODINGS.md §3)."""

import hashlib
from dataclasses import asdict, dataclass
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from models.dtypes import FLOAT_DTYPES, dtype_name, np_dtype
from models.t5 import check_t5_parameters, check_t5_weight_shape, t5_bias, t5_buckets
from service.arrays import Bundle
from service.errors import InvalidParameter
from service.routes.limits import MAX_BUCKETS, MAX_DISTANCE, MAX_LENGTH, MAX_OFFSET
from service.tables import IntDTypeQuery, TableDep, TensorSpec
from service.uploads import UPLOAD_MEDIA_TYPES, decode_tensor, read_body

router = APIRouter(tags=["tables"])

BiasDType = Literal["weight", "float32", "float16", "bfloat16", "float64"]

QueryLength = Annotated[int, Query(ge=1, le=MAX_LENGTH, description=(
    "Number of query rows; row i is the query at absolute position offset + i."))]
KeyLength = Annotated[int, Query(ge=1, le=MAX_LENGTH, description="Number of key columns (positions 0..).")]
Bidirectional = Annotated[bool, Query(description=(
    "true: encoder (future keys use the upper half of the buckets); false: decoder/causal (every "
    "future key shares the diagonal's bucket 0)."))]
NumBuckets = Annotated[int, Query(ge=2, le=MAX_BUCKETS, description=(
    "relative_attention_num_buckets. As in transformers, bidirectional mode uses num_buckets // 2 per "
    "direction: an odd count is accepted and its last bucket is never produced. Needs >= 4 "
    "(bidirectional) or >= 2 (causal)."))]
MaxDistance = Annotated[int, Query(ge=1, le=MAX_DISTANCE, description=(
    "relative_attention_max_distance: where the log-spaced buckets would reach num_buckets. Must "
    "exceed max_exact = num_buckets/4 (bidirectional) or num_buckets/2 (causal)."))]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description=(
    "Past tokens: query positions start here (compute_bias's past_seen_tokens)."))]

BODY_DOC = {
    "requestBody": {
        "required": True,
        "description": "The learned table `weight` [num_buckets, num_heads] (F64/F32/F16/BF16) as "
                       "safetensors (tensor `weight`, or the only tensor) or .npy (no pickle). "
                       "application/octet-stream is sniffed from the magic bytes.",
        "content": {media: {"schema": {"type": "string", "format": "binary"}}
                    for media in [*UPLOAD_MEDIA_TYPES, "application/octet-stream"]},
    }
}


@dataclass
class T5Geometry:
    """The query parameters both T5 routes share, checked together before anything else happens."""

    query_length: QueryLength
    key_length: KeyLength
    bidirectional: Bidirectional = True
    num_buckets: NumBuckets = 32
    max_distance: MaxDistance = 128
    offset: Offset = 0

    def __post_init__(self) -> None:
        check_t5_parameters(self.bidirectional, self.num_buckets, self.max_distance, self.offset)

    @property
    def args(self) -> tuple[int, int, bool, int, int, int]:
        """Positional arguments of `t5_buckets` / `t5_bias` after the weight."""
        return (self.query_length, self.key_length, self.bidirectional, self.num_buckets, self.max_distance,
                self.offset)


T5GeometryDep = Annotated[T5Geometry, Depends()]


@router.get(
    "/v1/t5/buckets",
    summary="T5 relative-position buckets of key − query",
    response_description="Tensor `buckets` [query_length, key_length].",
)
def buckets(table: TableDep, t5: T5GeometryDep, dtype: IntDTypeQuery = "int64") -> Response:
    """Bit-exact `T5Attention._relative_position_bucket(key − query)` (float32 log, then truncation)."""
    params = {**asdict(t5), "dtype": dtype}
    specs = {"buckets": TensorSpec((t5.query_length, t5.key_length), np_dtype(dtype))}

    def compute() -> Bundle:
        return Bundle({"buckets": t5_buckets(*t5.args, dtype)})

    return table.serve(endpoint="t5/buckets", params=params, specs=specs, compute=compute)


@router.post(
    "/v1/t5/bias",
    summary="T5 relative-position bias from an uploaded learned table",
    response_description="Tensor `bias` [num_heads, query_length, key_length].",
    openapi_extra=BODY_DOC,
)
async def bias(
    request: Request,
    table: TableDep,
    t5: T5GeometryDep,
    dtype: Annotated[BiasDType, Query(description=(
        "Element type of `bias`; `weight` (default) keeps the uploaded weight's dtype. The gather is "
        "exact, so any other choice equals casting the weight."))] = "weight",
) -> Response:
    """`T5Attention.compute_bias(q, k, past_seen_tokens=offset)[0]` with the uploaded weight."""
    body = await read_body(request.headers.get("content-length"), request.stream(),
                           table.settings.max_request_bytes)
    weight = await run_in_threadpool(decode_tensor, body, request.headers.get("content-type"), "weight")
    weight_dtype = dtype_name(weight.dtype)
    if weight_dtype not in FLOAT_DTYPES:
        raise InvalidParameter(f"weight: must be a float tensor ({', '.join(FLOAT_DTYPES)}), got {weight_dtype}")
    check_t5_weight_shape(weight.shape, t5.num_buckets)
    out_dtype = np_dtype(weight_dtype if dtype == "weight" else dtype)
    params = {**asdict(t5), "dtype": dtype_name(out_dtype), "weight_shape": list(weight.shape),
              "weight_dtype": weight_dtype, "weight_sha256": hashlib.sha256(weight.tobytes()).hexdigest()}
    specs = {"bias": TensorSpec((weight.shape[1], t5.query_length, t5.key_length), out_dtype)}

    def compute() -> Bundle:
        # casting the table first equals casting the gathered bias, at a fraction of the memory
        return Bundle({"bias": t5_bias(weight.astype(out_dtype, copy=False), *t5.args)})

    return await run_in_threadpool(table.serve, endpoint="t5/bias", params=params, specs=specs,
                                   compute=compute)
