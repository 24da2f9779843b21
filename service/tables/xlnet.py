"""XLNet / Transformer-XL relative sinusoid `GET /v1/relative/sinusoidal` (docs/ENCODINGS.md §12)."""

from collections.abc import Mapping
from typing import ClassVar

from pydantic import Field

from posenc.models.bounds import MAX_DIM, MAX_DISTANCE, MAX_SEQUENCE
from posenc.models.dtypes import np_dtype
from posenc.models.xlnet import XLNetAttnType, check_xlnet_parameters, xlnet_relative_sinusoid, xlnet_rows
from posenc.service.codec.encode import Bundle
from posenc.service.tables.fields import FloatDTypeField
from posenc.service.tables.registry import FLOAT64_TEMPORARY, TableQuery, TensorSpec, register_table


class XLNetRelativeQuery(TableQuery):
    """`XLNetModel.relative_positional_encoding(qlen, klen)` (bsz=None): row r holds distance klen − r
    (bi: klen … −qlen + 1; uni: klen … 0), columns [sin | cos]; axis 1 is (forward[, backward]).
    Transformer-XL's table is the uni one without its first row.
    """

    endpoint = "relative/sinusoidal"
    preset_table = "xlnet"
    tensors = ("pos_emb",)
    row_tensors: ClassVar[tuple[str, ...]] = ("pos_emb",)

    qlen: int = Field(ge=1, le=MAX_SEQUENCE, description="Query length (tokens of the current segment).")
    klen: int = Field(ge=1, le=MAX_SEQUENCE, description="Key length (memory + current segment).")
    d_model: int = Field(ge=2, le=MAX_DIM, json_schema_extra={"multipleOf": 2},
                         description="Model width (even): d_model/2 frequencies, [sin | cos].")
    attn_type: XLNetAttnType = Field("bi", description=(
        "bi: distances klen … −qlen + 1 (klen + qlen rows); uni: klen … 0 (klen + 1 rows)."))
    bi_data: bool = Field(False, description=(
        "Also the backward table (negated distances) as pos_emb[:, 1]; the reference's batch halves."))
    clamp_len: int = Field(-1, ge=-1, le=MAX_DISTANCE, description=(
        "Clamp distances to ±clamp_len when > 0 (XLNet's default −1: no clamping)."))
    dtype: FloatDTypeField = "float32"

    def check(self) -> None:
        check_xlnet_parameters(self.qlen, self.klen, self.d_model)

    def specs(self) -> dict[str, TensorSpec]:
        rows = xlnet_rows(self.qlen, self.klen, self.attn_type)
        return {"pos_emb": TensorSpec((rows, 2 if self.bi_data else 1, self.d_model), np_dtype(self.dtype))}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        # angles, sin and cos in float64 over half the table each
        return super().working_bytes(specs) + 2 * FLOAT64_TEMPORARY * specs["pos_emb"].size

    def compute_rows(self, rows: slice | None) -> Bundle:
        pos_emb = xlnet_relative_sinusoid(self.qlen, self.klen, self.d_model, self.attn_type, self.bi_data,
                                          self.clamp_len, np_dtype(self.dtype), rows)
        end = -self.qlen + 1 if self.attn_type == "bi" else 0
        return Bundle({"pos_emb": pos_emb}, {
            "row_order": f"relative distance klen - row: {self.klen} ... {end}",
            "column_order": "sin | cos", "axis1": "forward, backward" if self.bi_data else "forward"})


register_table("/v1/relative/sinusoidal", XLNetRelativeQuery,
               summary="XLNet / Transformer-XL relative sinusoidal position embedding",
               response_description="Tensor `pos_emb` [klen + qlen (bi) or klen + 1 (uni), 1 or 2 (bi_data), "
                                    "d_model].")
