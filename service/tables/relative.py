"""Relative-position index tables: DeBERTa log buckets and Shaw clipping (docs/ENCODINGS.md §4)."""

from pydantic import Field

from posenc.models.bounds import MAX_BUCKETS, MAX_DISTANCE, MAX_RELATIVE_POSITION, MAX_SEQUENCE
from posenc.models.deberta import (
    DEFAULT_DEBERTA_MAX_RELATIVE_POSITIONS,
    DEFAULT_DEBERTA_POSITION_BUCKETS,
    check_deberta_parameters,
    deberta_buckets,
)
from posenc.models.dtypes import np_dtype
from posenc.models.relative import clipped_relative_indices
from posenc.service.codec.encode import Bundle
from posenc.service.tables.fields import IntDTypeField
from posenc.service.tables.registry import TableQuery, TensorSpec, register_table


class RelativeQuery(TableQuery):
    """A [query_length, key_length] table of positions 0.. on both axes."""

    query_length: int = Field(ge=1, le=MAX_SEQUENCE, description="Number of query rows (positions 0..).")
    key_length: int = Field(ge=1, le=MAX_SEQUENCE, description="Number of key columns (positions 0..).")


class DebertaBucketsQuery(RelativeQuery):
    """Bit-exact `build_relative_position(q, k, position_buckets, max_relative_positions)`; not clamped
    (as the reference: distances >= max_relative_positions give buckets beyond position_buckets − 1).
    """

    endpoint = "deberta/buckets"
    preset_table = "deberta"
    tensors = ("relative_positions",)

    position_buckets: int = Field(DEFAULT_DEBERTA_POSITION_BUCKETS, ge=2, le=MAX_BUCKETS, description=(
        "position_buckets (bucket_size): |query − key| <= position_buckets // 2 is kept exactly."))
    max_relative_positions: int = Field(DEFAULT_DEBERTA_MAX_RELATIVE_POSITIONS, ge=3, le=MAX_DISTANCE, description=(
        "max_relative_positions (max_position): the distance that maps to ±(position_buckets − 1). "
        "Must exceed position_buckets // 2 + 1."))
    dtype: IntDTypeField = "int64"

    def check(self) -> None:
        check_deberta_parameters(self.position_buckets, self.max_relative_positions)

    def specs(self) -> dict[str, TensorSpec]:
        return {"relative_positions": TensorSpec((self.query_length, self.key_length), np_dtype(self.dtype))}

    def compute(self) -> Bundle:
        values = deberta_buckets(self.query_length, self.key_length, self.position_buckets,
                                 self.max_relative_positions, self.dtype)
        return Bundle({"relative_positions": values})


class ClippedQuery(RelativeQuery):
    """Shaw et al. (2018): clip(key − query, −k, k) + k, the rows of a learned [2k + 1, d] table."""

    endpoint = "relative/clipped"
    tensors = ("indices",)

    max_relative_position: int = Field(ge=0, le=MAX_RELATIVE_POSITION, description=(
        "Clipping distance k: indices are clip(key − query, −k, k) + k, rows of a [2k + 1, d] table."))
    dtype: IntDTypeField = "int64"

    def specs(self) -> dict[str, TensorSpec]:
        return {"indices": TensorSpec((self.query_length, self.key_length), np_dtype(self.dtype))}

    def compute(self) -> Bundle:
        indices = clipped_relative_indices(self.query_length, self.key_length, self.max_relative_position,
                                           self.dtype)
        return Bundle({"indices": indices})


register_table("/v1/deberta/buckets", DebertaBucketsQuery,
               summary="DeBERTa-v2/v3 log-bucketed relative positions of query − key",
               response_description="Tensor `relative_positions` [query_length, key_length].")
register_table("/v1/relative/clipped", ClippedQuery, summary="Clipped relative-position indices (Shaw et al. 2018)",
               response_description="Tensor `indices` [query_length, key_length], values in [0, 2k].")
