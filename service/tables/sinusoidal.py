"""Absolute sinusoidal position tables (docs/ENCODINGS.md §6)."""

from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import Field

from posenc.models.bounds import (
    DEFAULT_SINUSOIDAL_BASE,
    MAX_DIM,
    MAX_OFFSET,
    MAX_ROWS,
    MAX_SINUSOIDAL_BASE,
    MIN_SINUSOIDAL_BASE,
)
from posenc.models.dtypes import np_dtype
from posenc.models.sinusoidal import DEFAULT_FAIRSEQ_PADDING_IDX, SinusoidalVariant, sinusoidal_table
from posenc.service.codec.encode import Bundle
from posenc.service.tables.fields import FloatDTypeField
from posenc.service.tables.registry import FLOAT64_TEMPORARY, TableQuery, TensorSpec, register_table


class SinusoidalQuery(TableQuery):
    """The fixed sin/cos table of the Transformer paper and its variants, in float64 cast once."""

    endpoint = "sinusoidal"
    preset_table = "sinusoidal"
    tensors = ("pe",)
    row_tensors: ClassVar[tuple[str, ...]] = ("pe",)

    max_position: int = Field(ge=1, le=MAX_ROWS, description="Number of rows (positions).")
    dim: int = Field(ge=1, le=MAX_DIM, description="Embedding width (columns).")
    variant: SinusoidalVariant = Field("paper", description=(
        "paper: interleaved sin/cos, base^(-2i/d). tensor2tensor: [sin|cos], exp(-i ln(base)/(d/2-1)). "
        "fairseq: tensor2tensor spacing, row padding_idx zeroed (dim >= 4). marian: [sin|cos] with the "
        "paper's frequencies."))
    base: float = Field(DEFAULT_SINUSOIDAL_BASE, ge=MIN_SINUSOIDAL_BASE, le=MAX_SINUSOIDAL_BASE,
                        description="Frequency base (tensor2tensor: max_timescale).")
    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="Position of the first row.")
    padding_idx: int = Field(DEFAULT_FAIRSEQ_PADDING_IDX, ge=0, le=MAX_OFFSET,
                             description="fairseq only: position whose row is zero.")
    dtype: FloatDTypeField = "float32"

    def params(self) -> dict[str, Any]:
        # padding_idx only shapes the fairseq table: other variants must share one cache entry
        return self.model_dump(exclude=None if self.variant == "fairseq" else {"padding_idx"})

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        # angles and their sin/cos in float64 over the whole table
        return super().working_bytes(specs) + 2 * FLOAT64_TEMPORARY * specs["pe"].size

    def specs(self) -> dict[str, TensorSpec]:
        return {"pe": TensorSpec((self.max_position, self.dim), np_dtype(self.dtype))}

    def compute_rows(self, rows: slice | None) -> Bundle:
        pe = sinusoidal_table(self.max_position, self.dim, self.variant, self.base, self.offset, self.padding_idx,
                              np_dtype(self.dtype), rows)
        return Bundle({"pe": pe})


register_table("/v1/sinusoidal", SinusoidalQuery, summary="Sinusoidal absolute position table",
               response_description="Tensor `pe` [max_position, dim] in the negotiated wire format.")
