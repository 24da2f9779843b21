"""GET /v1/deberta/buckets and /v1/relative/clipped: relative-position index tables (ENCODINGS.md §4)."""

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from models.deberta import check_deberta_parameters, deberta_buckets
from models.dtypes import np_dtype
from models.relative import MAX_RELATIVE_POSITION, clipped_relative_indices
from service.arrays import Bundle
from service.routes.limits import MAX_BUCKETS, MAX_DISTANCE, MAX_LENGTH
from service.tables import IntDTypeQuery, TableDep, TensorSpec

router = APIRouter(tags=["tables"])

QueryLength = Annotated[int, Query(ge=1, le=MAX_LENGTH, description="Number of query rows (positions 0..).")]
KeyLength = Annotated[int, Query(ge=1, le=MAX_LENGTH, description="Number of key columns (positions 0..).")]


@router.get(
    "/v1/deberta/buckets",
    summary="DeBERTa-v2/v3 log-bucketed relative positions of query − key",
    response_description="Tensor `relative_positions` [query_length, key_length].",
)
def deberta(
    table: TableDep,
    query_length: QueryLength,
    key_length: KeyLength,
    position_buckets: Annotated[int, Query(ge=2, le=MAX_BUCKETS, description=(
        "position_buckets (bucket_size): |query − key| <= position_buckets // 2 is kept exactly."))] = 256,
    max_relative_positions: Annotated[int, Query(ge=3, le=MAX_DISTANCE, description=(
        "max_relative_positions (max_position): the distance that maps to ±(position_buckets − 1). "
        "Must exceed position_buckets // 2 + 1."))] = 512,
    dtype: IntDTypeQuery = "int64",
) -> Response:
    """Bit-exact `build_relative_position(q, k, position_buckets, max_relative_positions)`; not clamped
    (as the reference: distances >= max_relative_positions give buckets beyond position_buckets − 1)."""
    check_deberta_parameters(position_buckets, max_relative_positions)
    params = {"query_length": query_length, "key_length": key_length, "position_buckets": position_buckets,
              "max_relative_positions": max_relative_positions, "dtype": dtype}
    specs = {"relative_positions": TensorSpec((query_length, key_length), np_dtype(dtype))}

    def compute() -> Bundle:
        values = deberta_buckets(query_length, key_length, position_buckets, max_relative_positions, dtype)
        return Bundle({"relative_positions": values})

    return table.serve(endpoint="deberta/buckets", params=params, specs=specs, compute=compute)


@router.get(
    "/v1/relative/clipped",
    summary="Clipped relative-position indices (Shaw et al. 2018)",
    response_description="Tensor `indices` [query_length, key_length], values in [0, 2k].",
)
def clipped(
    table: TableDep,
    query_length: QueryLength,
    key_length: KeyLength,
    max_relative_position: Annotated[int, Query(ge=0, le=MAX_RELATIVE_POSITION, description=(
        "Clipping distance k: indices are clip(key − query, −k, k) + k, rows of a [2k + 1, d] table."))],
    dtype: IntDTypeQuery = "int64",
) -> Response:
    params = {"query_length": query_length, "key_length": key_length,
              "max_relative_position": max_relative_position, "dtype": dtype}
    specs = {"indices": TensorSpec((query_length, key_length), np_dtype(dtype))}

    def compute() -> Bundle:
        return Bundle({"indices": clipped_relative_indices(query_length, key_length, max_relative_position, dtype)})

    return table.serve(endpoint="relative/clipped", params=params, specs=specs, compute=compute)
