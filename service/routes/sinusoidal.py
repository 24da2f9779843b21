"""GET /v1/sinusoidal: absolute sinusoidal position tables (ENCODINGS.md §6)."""

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import Response

from models.dtypes import np_dtype
from models.sinusoidal import SinusoidalVariant, sinusoidal_table
from service.arrays import Bundle
from service.tables import FloatDTypeQuery, TableDep, TensorSpec

router = APIRouter(tags=["tables"])

MAX_ROWS = 1 << 31
MAX_DIM = 1 << 16
MAX_OFFSET = 1 << 40


@router.get(
    "/v1/sinusoidal",
    summary="Sinusoidal absolute position table",
    response_description="Tensor `pe` [max_position, dim] in the negotiated wire format.",
)
def sinusoidal(
    table: TableDep,
    max_position: Annotated[int, Query(ge=1, le=MAX_ROWS, description="Number of rows (positions).")],
    dim: Annotated[int, Query(ge=1, le=MAX_DIM, description="Embedding width (columns).")],
    variant: Annotated[
        SinusoidalVariant,
        Query(description="paper: interleaved sin/cos, base^(-2i/d). tensor2tensor: [sin|cos], "
                          "exp(-i ln(base)/(d/2-1)). fairseq: tensor2tensor spacing, row padding_idx zeroed "
                          "(dim >= 4). marian: [sin|cos] with the paper's frequencies."),
    ] = "paper",
    base: Annotated[
        float, Query(gt=0, le=1e12, description="Frequency base (tensor2tensor: max_timescale).")
    ] = 10000.0,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Position of the first row.")] = 0,
    padding_idx: Annotated[
        int, Query(ge=0, le=MAX_OFFSET, description="fairseq only: position whose row is zero.")
    ] = 1,
    dtype: FloatDTypeQuery = "float32",
) -> Response:
    params = {"max_position": max_position, "dim": dim, "variant": variant, "base": base,
              "offset": offset, "dtype": dtype}
    if variant == "fairseq":
        params["padding_idx"] = padding_idx
    specs = {"pe": TensorSpec((max_position, dim), np_dtype(dtype))}

    def compute() -> Bundle:
        pe = sinusoidal_table(max_position, dim, variant, base, offset, padding_idx, np_dtype(dtype))
        return Bundle({"pe": pe})

    return table.serve(endpoint="sinusoidal", params=params, specs=specs, compute=compute)
