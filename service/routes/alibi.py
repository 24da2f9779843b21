"""GET /v1/alibi/slopes and /v1/alibi/bias: ALiBi head slopes and bias tensors (ENCODINGS.md §5)."""

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from models.alibi import AlibiMode, alibi_bias, alibi_slopes, check_alibi_parameters
from models.dtypes import np_dtype
from service.arrays import Bundle
from service.routes.limits import MAX_HEADS, MAX_LENGTH
from service.tables import FloatDTypeQuery, TableDep, TensorSpec

router = APIRouter(tags=["tables"])

NumHeads = Annotated[int, Query(ge=1, le=MAX_HEADS, description="Number of attention heads (any count, "
                                "powers of two or not).")]
AlibiBiasMax = Annotated[float, Query(
    gt=0, le=1024,
    description="MPT's `alibi_bias_max`: slopes are 2^(−k·max/N), N = 2^ceil(log2 num_heads). "
                "8 (default) is the paper's value.")]


@router.get(
    "/v1/alibi/slopes",
    summary="ALiBi slopes in the paper's head ordering",
    response_description="Tensor `slopes` [num_heads].",
)
def slopes(
    table: TableDep,
    num_heads: NumHeads,
    alibi_bias_max: AlibiBiasMax = 8.0,
    dtype: FloatDTypeQuery = "float32",
) -> Response:
    """Power-of-two heads get 2^(−8k/n); other counts the 2^floor(log2 n) block first, then the
    odd-step extras of the next power of two (paper code / MPT `gen_slopes`). Computed in float64,
    cast once to `dtype`.
    """
    check_alibi_parameters(num_heads, alibi_bias_max)
    params = {"num_heads": num_heads, "alibi_bias_max": alibi_bias_max, "dtype": dtype}
    specs = {"slopes": TensorSpec((num_heads,), np_dtype(dtype))}

    def compute() -> Bundle:
        return Bundle({"slopes": alibi_slopes(num_heads, alibi_bias_max).astype(np_dtype(dtype))})

    return table.serve(endpoint="alibi/slopes", params=params, specs=specs, compute=compute)


@router.get(
    "/v1/alibi/bias",
    summary="ALiBi bias [num_heads, query_length, key_length]",
    response_description="Tensor `bias` [num_heads, query_length, key_length].",
)
def bias(
    table: TableDep,
    num_heads: NumHeads,
    query_length: Annotated[int, Query(ge=1, le=MAX_LENGTH, description=(
        "Number of query rows; row i is the query at position key_length − query_length + i "
        "(rows aligned to the end of the keys, as when decoding with a KV cache)."))],
    key_length: Annotated[int, Query(ge=1, le=MAX_LENGTH, description="Number of key columns (positions 0..).")],
    mode: Annotated[AlibiMode, Query(description=(
        "causal: −m·(i−j) (flash-attn's form); symmetric: −m·|i−j| (bidirectional encoders); "
        "bloom: +m·j, equal to transformers' build_alibi_tensor (BLOOM's float32 slopes and product); "
        "mpt: m·(j−(key_length−1)), equal to build_mpt_alibi_tensor (float32). causal and symmetric "
        "are computed in float64 and cast once; bloom and mpt are the references' float32 values cast "
        "to dtype."))] = "causal",
    mask: Annotated[bool, Query(description=(
        "Put −inf where a causal query may not attend (keys after the query's position).")
    )] = False,
    alibi_bias_max: AlibiBiasMax = 8.0,
    dtype: FloatDTypeQuery = "float32",
) -> Response:
    check_alibi_parameters(num_heads, alibi_bias_max)
    params = {"num_heads": num_heads, "query_length": query_length, "key_length": key_length, "mode": mode,
              "mask": mask, "alibi_bias_max": alibi_bias_max, "dtype": dtype}
    specs = {"bias": TensorSpec((num_heads, query_length, key_length), np_dtype(dtype))}

    def compute() -> Bundle:
        values = alibi_bias(num_heads, query_length, key_length, mode, mask, alibi_bias_max, dtype)
        return Bundle({"bias": values}, {"first_query_position": str(key_length - query_length)})

    return table.serve(endpoint="alibi/bias", params=params, specs=specs, compute=compute)
