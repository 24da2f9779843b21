"""`GET /v1/properties/{rope,sinusoidal,alibi,t5}`: the properties of a family's table as named curves
and a summary (docs/properties.md).

Each query is the family's table query (same parameters, bounds and defaults) plus the sample size of
the random measurements; the math is `posenc.models.properties`. The curves are the tensors (every wire
format, ETag, cache and size limit of the tables); the scalars are the metadata (format=json shows
them under "metadata"); format=png draws the curves.
"""

from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, create_model

from posenc.models.dtypes import np_dtype
from posenc.models.properties.bias import alibi_bias_by_offset, alibi_mode_slopes, t5_bucket_curve
from posenc.models.properties.measures import (
    MAX_PAIRS,
    MAX_PROPERTY_ELEMENTS,
    MAX_PROPERTY_ROWS,
    check_rows,
    check_work,
)
from posenc.models.properties.rope import context_length, rope_properties
from posenc.models.properties.sinusoidal import sinusoidal_properties
from posenc.models.relative import key_minus_query
from posenc.models.rope import RopeParameters
from posenc.service.codec.encode import Bundle
from posenc.service.errors import InvalidParameter
from posenc.service.tables.alibi import AlibiBiasQuery
from posenc.service.tables.fields import documented_within
from posenc.service.tables.png import Curve, Heatmap, Panel, Picture, titled
from posenc.service.tables.registry import TableQuery, TensorSpec, register_properties
from posenc.service.tables.rope import RopeQuery
from posenc.service.tables.sinusoidal import SinusoidalQuery
from posenc.service.tables.t5 import T5BucketsQuery

F64, I64 = np.dtype(np.float64), np.dtype(np.int64)
Pairs = Field(256, ge=1, le=MAX_PAIRS, description="Random (m, n) pairs of the relativity and norm measurements.")
Seed = Field(0, ge=0, le=2**32 - 1, description="Seed of the random vectors and pairs (same seed, same answer).")
MAX_CURVES = 8  # heads drawn as curves in one panel
# The documented maxima of the properties' sizes (`documented_within`): every combination they allow passes the
# limits below, which join several parameters (the server checks the limits themselves)
PROPERTY_WIDTH = MAX_PROPERTY_ELEMENTS // MAX_PROPERTY_ROWS  # a width that any row or pair count allowed fits
PROPERTY_CUBE = 1 << (MAX_PROPERTY_ELEMENTS.bit_length() - 1) // 3  # three factors whose product fits
WIDTH_RULE = (f"Properties: at most {MAX_PROPERTY_ROWS} positions, and positions × width and pairs × width at most "
              f"{MAX_PROPERTY_ELEMENTS} each; the document's maxima keep within them.")
ALIBI_RULE = (f"Properties: num_heads × query_length × key_length at most {MAX_PROPERTY_ELEMENTS} (and query_length + "
              f"key_length − 1 at most {MAX_PROPERTY_ROWS}); the document's maxima keep within them.")
OFFSETS_RULE = (f"Properties: query_length + key_length − 1 at most {MAX_PROPERTY_ROWS}; the document's maximum keeps "
                "within it.")


def summary(scalars: Mapping[str, Any]) -> dict[str, str]:
    """The scalars as metadata strings (None: "none")."""
    return {name: "none" if value is None else repr(value) if isinstance(value, float) else str(value)
            for name, value in scalars.items()}


class PropertiesQuery(TableQuery):
    """What every properties route shares: format=png draws all curves (?tensor= draws one)."""

    row_tensors: ClassVar[tuple[str, ...]] = ()  # measurements of a table, not its rows: computed in one piece

    def picture_tensors(self) -> tuple[str, ...]:
        return self.tensors

    def picture_elements(self, specs: Mapping[str, TensorSpec], selected: list[str]) -> int:
        if len(selected) == 1:
            return super().picture_elements(specs, selected)
        return sum(specs[name].size for name in selected)

    def picture(self, tensors: Mapping[str, np.ndarray], params: Mapping[str, str]) -> Picture:
        if len(tensors) == 1:
            return super().picture(tensors, params)
        return Picture(titled(f"/v1/{self.endpoint}", self.described(params)), self.panels(tensors, params))

    def described(self, params: Mapping[str, str]) -> dict[str, str]:
        """The parameters named in a picture's title (the query's own, not the measured scalars)."""
        return {k: v for k, v in params.items() if k in type(self).model_fields}

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        raise NotImplementedError


def table_fields(query: type[TableQuery], exclude: tuple[str, ...]) -> Any:
    """A `PropertiesQuery` base declaring the fields of a table query (bounds, defaults, descriptions)
    but `exclude`: the table parameters no property depends on (every parameter must change the answer)."""
    fields: dict[str, Any] = {name: (field.annotation, field) for name, field in query.model_fields.items()
                              if name not in exclude}
    return create_model(f"{query.__name__}Fields", __base__=PropertiesQuery, **fields)


class RopePropertiesQuery(table_fields(RopeQuery, exclude=("layout", "form"))):  # type: ignore[misc]  # dynamic base
    """Uniqueness (row distances, first exact collision in the served dtype), relativity residual,
    norm preservation, RoFormer's long-range decay bound, the inner product of rotated ones, every
    frequency's wavelength against the training context and how the rope_type moved it, and permutation
    equivariance. The parameters of `GET /v1/rope` but layout and form (inner products do not depend on
    the channel order).
    """

    endpoint = "properties/rope"
    preset_table = "rope"
    tensors = ("distance", "pair_distance", "adjacent_distance", "decay_bound", "inner_ones", "inv_freq",
               "default_inv_freq", "wavelength", "frequency_scale", "completes_turn", "relativity_position",
               "relativity_residual", "norm_ratio")

    max_position: int = documented_within(RopeQuery, "max_position", MAX_PROPERTY_ROWS, WIDTH_RULE)
    head_dim: int = documented_within(RopeQuery, "head_dim", PROPERTY_WIDTH, WIDTH_RULE)
    rotary_dim: int | None = documented_within(RopeQuery, "rotary_dim", PROPERTY_WIDTH, WIDTH_RULE)
    pairs: int = Pairs
    seed: int = Seed

    @cached_property
    def table(self) -> RopeQuery:
        """The table route's query (layout and form at their defaults)."""
        return RopeQuery.model_validate(self.model_dump(exclude={"pairs", "seed"}))

    @property
    def rope(self) -> RopeParameters:
        return self.table.rope

    def check(self) -> None:
        self.table.check()
        check_rows("max_position", self.max_position)
        check_work(self.max_position, self.pairs, self.rope.table_dim, "rotary_dim")

    def params(self) -> dict[str, Any]:
        return {**self.table.params(), "layout": None, "form": None, "pairs": self.pairs, "seed": self.seed}

    def specs(self) -> dict[str, TensorSpec]:
        rows, freqs, pairs = self.max_position, self.rope.n_frequencies, self.pairs
        shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {
                  "distance": ((rows,), I64), "pair_distance": ((rows,), F64), "adjacent_distance": ((rows - 1,), F64),
                  "decay_bound": ((rows,), F64), "inner_ones": ((rows,), F64),
                  "inv_freq": ((freqs,), np.dtype(np.float32)), "default_inv_freq": ((freqs,), np.dtype(np.float32)),
                  "wavelength": ((freqs,), F64), "frequency_scale": ((freqs,), F64),
                  "completes_turn": ((freqs,), np.dtype(np.bool_)), "relativity_position": ((pairs,), I64),
                  "relativity_residual": ((pairs,), F64), "norm_ratio": ((pairs,), F64)}
        return {name: TensorSpec(*shapes[name]) for name in self.tensors}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        # served and float64 rows [rows, d], complex partial sums by blocks, and q/k/rotations [pairs, d]
        width = 2 * self.rope.n_frequencies
        rows_and_pairs = 40 * self.max_position * width + 64 * self.pairs * width
        return TableQuery.working_bytes(self, specs) + rows_and_pairs + (16 << 20)

    def compute(self) -> Bundle:
        measured = rope_properties(self.rope, self.max_position, self.offset, np_dtype(self.dtype), self.pairs,
                                   self.seed)
        return Bundle(measured.curves, summary(measured.scalars))

    def described(self, params: Mapping[str, str]) -> dict[str, str]:
        keep = ("head_dim", "rope_theta", "rope_type", "factor", "max_position", "dtype")
        return {k: params[k] for k in keep if k in params}

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        index = np.arange(t["wavelength"].size)
        context = float(context_length(self.rope, self.max_position))
        return (
            Panel("long-range decay", "relative distance m − n", "value",
                  (Curve(t["distance"], t["decay_bound"], "RoFormer bound (1/(d/2))·Σ|S_j|"),
                   Curve(t["distance"], t["inner_ones"] / max(float(t["inner_ones"][0]), 1e-300),
                         "⟨RoPE(1,m), RoPE(1,n)⟩ / d"))),
            Panel("uniqueness", "relative distance m − n", "‖row(m) − row(n)‖",
                  (Curve(t["distance"], t["pair_distance"], "exact"),
                   Curve(t["distance"][1:], t["adjacent_distance"], f"adjacent rows, {self.dtype}", "points"))),
            Panel("extrapolation: wavelength 2π/θ_i", "frequency index i", "positions",
                  (Curve(index, t["wavelength"], f"{self.rope_type} (served)"),
                   Curve(index, 2 * np.pi / t["default_inv_freq"].astype(np.float64), "unscaled"),
                   Curve(index, np.full(index.size, context), "training context")), logy=True),
            Panel(f"relativity residual ({self.dtype} table)", "max(m, n)", "|⟨R q, R k⟩ − ⟨q, R k⟩| / ‖q‖‖k‖",
                  (Curve(t["relativity_position"], t["relativity_residual"], None, "points"),)),
        )


class SinusoidalPropertiesQuery(PropertiesQuery, SinusoidalQuery):
    """Uniqueness (row distances, first exact collision in the served dtype), the relativity residual
    of PE(p+k) = M_k·PE(p) (M_k a block rotation by k·ω_i, independent of p) and PE(m)·PE(n) against
    m − n."""

    endpoint = "properties/sinusoidal"
    tensors = ("distance", "pair_distance", "dot_product", "adjacent_distance", "omega", "relativity_position",
               "relativity_residual")  # type: ignore[assignment]  # curves, not the table's

    max_position: int = documented_within(SinusoidalQuery, "max_position", MAX_PROPERTY_ROWS, WIDTH_RULE)
    dim: int = documented_within(SinusoidalQuery, "dim", PROPERTY_WIDTH, WIDTH_RULE)
    pairs: int = Pairs
    seed: int = Seed

    def check(self) -> None:
        super().check()
        check_rows("max_position", self.max_position)
        check_work(self.max_position, self.pairs, self.dim, "dim")

    def specs(self) -> dict[str, TensorSpec]:
        rows, freqs, pairs = self.max_position, self.dim // 2, self.pairs
        shapes = {"distance": ((rows,), I64), "pair_distance": ((rows,), F64), "dot_product": ((rows,), F64),
                  "adjacent_distance": ((rows - 1,), F64), "omega": ((freqs,), F64),
                  "relativity_position": ((pairs,), I64), "relativity_residual": ((pairs,), F64)}
        return {name: TensorSpec(*shapes[name]) for name in self.tensors}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        return TableQuery.working_bytes(self, specs) + 24 * self.max_position * self.dim + 64 * self.pairs * self.dim

    def compute(self) -> Bundle:
        measured = sinusoidal_properties(self.max_position, self.dim, self.variant, self.base, self.offset,
                                         self.padding_idx, np_dtype(self.dtype), self.pairs, self.seed)
        return Bundle(measured.curves, summary(measured.scalars))

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        return (
            Panel("PE(m)·PE(n)", "relative distance m − n", "dot product", (Curve(t["distance"], t["dot_product"]),)),
            Panel("uniqueness", "relative distance m − n", "‖PE(m) − PE(n)‖",
                  (Curve(t["distance"], t["pair_distance"], "exact"),
                   Curve(t["distance"][1:], t["adjacent_distance"], f"adjacent rows, {self.dtype}", "points"))),
            Panel("frequencies ω_i", "i", "ω_i", (Curve(np.arange(t["omega"].size), t["omega"]),), logy=True),
            Panel(f"relativity residual ({self.dtype} table)", "p + k", "‖PE(p+k) − M_k·PE(p)‖ / ‖PE(p+k)‖",
                  (Curve(t["relativity_position"], t["relativity_residual"], None, "points"),)),
        )


def head_curves(x: np.ndarray, per_head: np.ndarray) -> tuple[Curve, ...]:
    return tuple(Curve(x, per_head[h], f"head {h}") for h in range(min(per_head.shape[0], MAX_CURVES)))


class AlibiPropertiesQuery(PropertiesQuery, AlibiBiasQuery):
    """Long-range decay: the bias each head adds against key − query offset, read off the served table
    (its last row, then its last column; −inf where masked), and the slopes of the mode."""

    endpoint = "properties/alibi"
    tensors = ("relative_position", "bias_by_offset", "slopes")  # type: ignore[assignment]  # curves, not the table's
    num_heads: int = documented_within(AlibiBiasQuery, "num_heads", PROPERTY_CUBE, ALIBI_RULE)
    query_length: int = documented_within(AlibiBiasQuery, "query_length", PROPERTY_CUBE, ALIBI_RULE)
    key_length: int = documented_within(AlibiBiasQuery, "key_length", PROPERTY_CUBE, ALIBI_RULE)

    def check(self) -> None:
        super().check()
        check_rows("query_length + key_length − 1", self.query_length + self.key_length - 1)
        if self.num_heads * self.query_length * self.key_length > MAX_PROPERTY_ELEMENTS:
            raise InvalidParameter(f"num_heads × query_length × key_length must be at most {MAX_PROPERTY_ELEMENTS} "
                                   "for the properties (the served table is read)")

    def specs(self) -> dict[str, TensorSpec]:
        offsets = self.query_length + self.key_length - 1
        return {"relative_position": TensorSpec((offsets,), I64),
                "bias_by_offset": TensorSpec((self.num_heads, offsets), np_dtype(self.dtype)),
                "slopes": TensorSpec((self.num_heads,), F64)}

    def compute(self) -> Bundle:
        offsets, per_offset = alibi_bias_by_offset(self.num_heads, self.query_length, self.key_length, self.mode,
                                                   self.mask, self.alibi_bias_max, self.dtype)
        farthest = per_offset[:, 0].astype(np.float64)  # the first key, seen from the last query
        scalars = {"bias_at_max_distance_min": float(farthest.min()), "bias_at_max_distance_max": float(farthest.max())}
        return Bundle({"relative_position": offsets, "bias_by_offset": per_offset,
                       "slopes": alibi_mode_slopes(self.num_heads, self.mode, self.alibi_bias_max)}, summary(scalars))

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        return (Panel(f"ALiBi bias against key − query (mode={self.mode})", "key − query",
                      "bias added to the logit", head_curves(t["relative_position"], t["bias_by_offset"])),
                Panel("slopes", "head", "slope m", (Curve(np.arange(t["slopes"].size), t["slopes"], None, "points"),)))


class T5PropertiesQuery(PropertiesQuery, T5BucketsQuery):
    """Bucket of every key − query offset of the table, and the bucket boundaries (the offsets where a
    new bucket starts): exact below max_exact, log-spaced up to max_distance, shared beyond."""

    endpoint = "properties/t5"
    tensors = ("relative_position", "bucket", "boundaries")  # type: ignore[assignment]  # curves, not the table's
    query_length: int = documented_within(T5BucketsQuery, "query_length", MAX_PROPERTY_ROWS // 2, OFFSETS_RULE)
    key_length: int = documented_within(T5BucketsQuery, "key_length", MAX_PROPERTY_ROWS // 2, OFFSETS_RULE)

    def check(self) -> None:
        super().check()
        check_rows("query_length + key_length − 1", self.query_length + self.key_length - 1)

    @cached_property
    def curve(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        offsets = key_minus_query(self.query_length, self.key_length) - self.offset  # int64 [q + k − 1]
        return (offsets, *t5_bucket_curve(offsets, self.bidirectional, self.num_buckets, self.max_distance))

    def specs(self) -> dict[str, TensorSpec]:
        offsets, _, boundaries = self.curve
        out = np_dtype(self.dtype)
        return {"relative_position": TensorSpec(offsets.shape, I64), "bucket": TensorSpec(offsets.shape, out),
                "boundaries": TensorSpec(boundaries.shape, I64)}

    def compute(self) -> Bundle:
        offsets, buckets, boundaries = self.curve
        used = np.unique(buckets)
        scalars = {"buckets_used": int(used.size), "boundaries": int(boundaries.size)}
        return Bundle({"relative_position": offsets, "bucket": buckets.astype(np_dtype(self.dtype)),
                       "boundaries": boundaries}, summary(scalars))

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        return (Panel("T5 bucket against key − query", "key − query", "bucket",
                      (Curve(t["relative_position"], t["bucket"], None, "step"),),
                      marks=tuple(float(b) for b in t["boundaries"]), mark_label="bucket boundaries"),)


register_properties("/v1/properties/rope", RopePropertiesQuery,
                    summary="Properties of a RoPE table: relativity, norm, decay, uniqueness, extrapolation",
                    response_description="Curves as tensors (distance, decay_bound, wavelength, "
                                         "relativity_residual, ...); scalars (min_pair_distance, "
                                         "relativity_max_residual, ...) in the metadata.")
register_properties("/v1/properties/sinusoidal", SinusoidalPropertiesQuery,
                    summary="Properties of a sinusoidal table: relativity, dot product against distance, uniqueness")
register_properties("/v1/properties/alibi", AlibiPropertiesQuery,
                    summary="ALiBi: the bias each head adds against distance")
register_properties("/v1/properties/t5", T5PropertiesQuery,
                    summary="T5: bucket against key − query, with the bucket boundaries")

__all__ = ["PropertiesQuery", "summary"]
