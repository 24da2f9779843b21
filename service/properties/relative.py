"""`GET /v1/properties/{deberta,relative,xlnet}`: the properties of the relative-position tables
(docs/properties.md): DeBERTa's log buckets (`/v1/deberta/buckets`), Shaw et al.'s clipped indices
(`/v1/relative/clipped`) and XLNet's relative sinusoid (`/v1/relative/sinusoidal`).

Same conventions as `posenc.service.properties.families`: the table route's parameters, curves as tensors,
scalars as metadata, format=png draws the curves.
"""

import math
from collections.abc import Mapping
from functools import cached_property
from typing import ClassVar

import numpy as np

from posenc.models.deberta import deberta_buckets, deberta_log_bucket_position
from posenc.models.dtypes import np_dtype
from posenc.models.properties.measures import MAX_PROPERTY_ELEMENTS, MAX_PROPERTY_ROWS, check_rows, check_work
from posenc.models.properties.relative import TOEPLITZ_BLOCK, index_curve_properties, toeplitz_violation
from posenc.models.properties.xlnet import xlnet_properties
from posenc.models.relative import clipped_relative_indices, key_minus_query
from posenc.models.xlnet import xlnet_rows
from posenc.service.codec.encode import Bundle
from posenc.service.errors import InvalidParameter
from posenc.service.properties.families import (
    F64,
    I64,
    PROPERTY_WIDTH,
    WIDTH_RULE,
    Pairs,
    PropertiesQuery,
    Seed,
    summary,
)
from posenc.service.tables.fields import documented_within
from posenc.service.tables.png import Curve, Heatmap, Panel
from posenc.service.tables.registry import TableQuery, TensorSpec, register_properties
from posenc.service.tables.relative import ClippedQuery, DebertaBucketsQuery, RelativeQuery
from posenc.service.tables.xlnet import XLNetRelativeQuery

INDEX_SIDE = math.isqrt(MAX_PROPERTY_ELEMENTS)  # both sides at most this: the product and the offsets fit
INDEX_RULE = (f"Properties: query_length × key_length at most {MAX_PROPERTY_ELEMENTS} and query_length + "
              f"key_length − 1 at most {MAX_PROPERTY_ROWS}; the document's maxima keep within them.")
XLNET_SIDE = MAX_PROPERTY_ROWS // 4  # klen + qlen rows, twice with bi_data, at most MAX_PROPERTY_ROWS


class IndexPropertiesQuery(PropertiesQuery, RelativeQuery):
    """An index table [query, key] read as a curve over key − query: the index of every offset, how
    many offsets share it, the boundaries (offsets where the index changes), and the checks."""

    index_name: ClassVar[str] = "index"

    query_length: int = documented_within(RelativeQuery, "query_length", INDEX_SIDE, INDEX_RULE)
    key_length: int = documented_within(RelativeQuery, "key_length", INDEX_SIDE, INDEX_RULE)

    def per_offset(self, offsets: np.ndarray) -> np.ndarray:
        """The family's index of each key − query offset (int64), from the model's per-offset function."""
        raise NotImplementedError

    def served_table(self) -> np.ndarray:
        """The table the family's route serves [query_length, key_length]."""
        raise NotImplementedError

    def check(self) -> None:
        super().check()
        check_rows("query_length + key_length − 1", self.query_length + self.key_length - 1)
        if self.query_length * self.key_length > MAX_PROPERTY_ELEMENTS:
            raise InvalidParameter(f"query_length × key_length must be at most {MAX_PROPERTY_ELEMENTS} for the "
                                   "properties (the served table is read)")

    @cached_property
    def curve(self) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], dict[str, int | str | None]]:
        offsets = key_minus_query(self.query_length, self.key_length)  # int64 [q + k − 1]
        index = self.per_offset(offsets)
        return (offsets, index, *index_curve_properties(offsets, index))

    def specs(self) -> dict[str, TensorSpec]:
        offsets, _, curves, _ = self.curve
        return {"relative_position": TensorSpec(offsets.shape, I64),
                self.index_name: TensorSpec(offsets.shape, np_dtype(self.dtype)),  # type: ignore[attr-defined]
                "offsets_per_index": TensorSpec(offsets.shape, I64),
                "boundaries": TensorSpec(curves["boundaries"].shape, I64)}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        # the served table, then int64 blocks of it against the curve
        table = self.query_length * self.key_length * np_dtype(self.dtype).itemsize  # type: ignore[attr-defined]
        return TableQuery.working_bytes(self, specs) + table + 32 * TOEPLITZ_BLOCK

    def compute(self) -> Bundle:
        offsets, index, curves, scalars = self.curve
        violation = toeplitz_violation(self.served_table(), index)
        return Bundle({"relative_position": offsets, self.index_name: index.astype(np_dtype(self.dtype)),  # type: ignore[attr-defined]
                       **curves}, summary({**scalars, "toeplitz_max_violation": violation}))

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        x = t["relative_position"]
        marks = tuple(float(b) for b in t["boundaries"])
        return (Panel(f"{self.index_name} against key − query", "key − query", self.index_name,
                      (Curve(x, t[self.index_name], None, "step"),), marks=marks, mark_label="boundaries"),
                Panel("offsets sharing each offset's index", "key − query", "offsets",
                      (Curve(x, t["offsets_per_index"], None, "step"),)))


class DebertaPropertiesQuery(IndexPropertiesQuery, DebertaBucketsQuery):
    """DeBERTa's log bucket of every key − query offset (the table holds bucket(query − key): exact up
    to position_buckets // 2, log-spaced beyond, not clamped), which offsets share a bucket, the sign
    convention and symmetry, and the Toeplitz check of the served table."""

    endpoint = "properties/deberta"
    tensors = ("relative_position", "bucket", "offsets_per_index", "boundaries")  # type: ignore[assignment]  # curves
    index_name = "bucket"

    def per_offset(self, offsets: np.ndarray) -> np.ndarray:
        return deberta_log_bucket_position(-offsets, self.position_buckets, self.max_relative_positions)

    def served_table(self) -> np.ndarray:
        return deberta_buckets(self.query_length, self.key_length, self.position_buckets,
                               self.max_relative_positions, self.dtype)


class ClippedPropertiesQuery(IndexPropertiesQuery, ClippedQuery):
    """Shaw et al.'s index clip(key − query, −k, k) + k of every offset: exact inside ±k (the clip
    points), shared beyond; sign convention, symmetry about k, and the Toeplitz check."""

    endpoint = "properties/relative"
    tensors = ("relative_position", "index", "offsets_per_index", "boundaries")  # type: ignore[assignment]  # curves

    def per_offset(self, offsets: np.ndarray) -> np.ndarray:
        k = self.max_relative_position
        return np.clip(offsets, -k, k) + k

    def served_table(self) -> np.ndarray:
        return clipped_relative_indices(self.query_length, self.key_length, self.max_relative_position, self.dtype)


class XLNetPropertiesQuery(PropertiesQuery, XLNetRelativeQuery):
    """The sinusoidal measurements on XLNet's rows R_{i−j}: uniqueness (row distances, first exact
    collision), relativity R_{d+k} = M_k·R_d on random served rows, and R_d·R_0 against d."""

    endpoint = "properties/xlnet"
    tensors = ("distance", "pair_distance", "dot_product", "adjacent_distance", "omega", "relativity_distance",
               "relativity_residual")  # type: ignore[assignment]  # curves, not the table's

    qlen: int = documented_within(XLNetRelativeQuery, "qlen", XLNET_SIDE, WIDTH_RULE)
    klen: int = documented_within(XLNetRelativeQuery, "klen", XLNET_SIDE, WIDTH_RULE)
    d_model: int = documented_within(XLNetRelativeQuery, "d_model", PROPERTY_WIDTH, WIDTH_RULE)
    pairs: int = Pairs
    seed: int = Seed

    @property
    def rows(self) -> int:
        return xlnet_rows(self.qlen, self.klen, self.attn_type)

    def check(self) -> None:
        super().check()
        check_rows("klen + qlen", self.rows)
        check_work(self.rows * (2 if self.bi_data else 1), self.pairs, self.d_model, "d_model", "rows")

    def specs(self) -> dict[str, TensorSpec]:
        largest = max(self.klen, self.qlen - 1) if self.attn_type == "bi" else self.klen  # largest |distance|
        shapes = {"distance": ((largest + 1,), I64), "pair_distance": ((largest + 1,), F64),
                  "dot_product": ((largest + 1,), F64), "adjacent_distance": ((self.rows - 1,), F64),
                  "omega": ((self.d_model // 2,), F64), "relativity_distance": ((self.pairs,), I64),
                  "relativity_residual": ((self.pairs,), F64)}
        return {name: TensorSpec(*shapes[name]) for name in self.tensors}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        width = self.d_model * (2 if self.bi_data else 1)
        return TableQuery.working_bytes(self, specs) + 40 * self.rows * width + 64 * self.pairs * self.d_model

    def compute(self) -> Bundle:
        curves, scalars = xlnet_properties(self.qlen, self.klen, self.d_model, self.attn_type, self.bi_data,
                                           self.clamp_len, np_dtype(self.dtype), self.pairs, self.seed)
        return Bundle(curves, summary(scalars))

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        return (
            Panel("R_d·R_0", "relative distance d", "dot product", (Curve(t["distance"], t["dot_product"]),)),
            Panel("uniqueness", "relative distance d", "‖R_d − R_0‖", (Curve(t["distance"], t["pair_distance"]),)),
            Panel(f"relativity residual ({self.dtype} table)", "distance of the target row",
                  "‖R_b − M_(b−a)·R_a‖ / ‖R_b‖",
                  (Curve(t["relativity_distance"], t["relativity_residual"], None, "points"),)),
        )


register_properties("/v1/properties/deberta", DebertaPropertiesQuery,
                    summary="DeBERTa: bucket against key − query, shared buckets, symmetry, Toeplitz check")
register_properties("/v1/properties/relative", ClippedPropertiesQuery,
                    summary="Shaw clipped indices: index against key − query, clip points, symmetry, Toeplitz check")
register_properties("/v1/properties/xlnet", XLNetPropertiesQuery,
                    summary="XLNet relative sinusoid: relativity, R_d·R_0 against d, uniqueness")
