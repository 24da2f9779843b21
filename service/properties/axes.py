"""`GET /v1/properties/rope/vision` and `POST /v1/properties/rope/mrope`: the properties of the
multi-axis RoPE tables (docs/properties.md): per axis (height/width; t/h/w) each frequency's wavelength
against the positions the axis spans and the relativity residual, over all frequencies norm
preservation and the uniqueness of the served rows.

Same conventions as `posenc.service.properties.families`: the table route's parameters (vision: but form, which no
property depends on; M-RoPE: the same query string and JSON body), curves as tensors, scalars as metadata.
"""

import math
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np

from posenc.models.dtypes import np_dtype
from posenc.models.properties.axes import MROPE_AXES, VISION_AXES, mrope_properties, vision_properties
from posenc.models.properties.measures import MAX_PROPERTY_ELEMENTS, MAX_PROPERTY_ROWS, check_rows, check_work
from posenc.models.vision_rope import vision_rows
from posenc.service.codec.encode import Bundle
from posenc.service.properties.families import (
    F64,
    I64,
    PROPERTY_WIDTH,
    Pairs,
    PropertiesQuery,
    Seed,
    summary,
    table_fields,
)
from posenc.service.tables.fields import documented_within
from posenc.service.tables.mrope import MropeQuery
from posenc.service.tables.png import Curve, Heatmap, Panel
from posenc.service.tables.registry import TableQuery, TensorSpec, register_properties
from posenc.service.tables.vision_rope import VisionRopeQuery

F32, BOOL = np.dtype(np.float32), np.dtype(np.bool_)
VISION_SIDE = math.isqrt(MAX_PROPERTY_ROWS)  # height × width patches within MAX_PROPERTY_ROWS
VISION_RULE = (f"Properties: at most {MAX_PROPERTY_ROWS} patches (height × width; llama4: (image_size // patch_size)² "
               f"+ 1), and patches × head_dim and pairs × head_dim at most {MAX_PROPERTY_ELEMENTS} each; the "
               "document's maxima keep within them, but for an image_size // patch_size above "
               f"{VISION_SIDE - 1} with height or width not given.")


def axis_specs(freqs: int, pairs: int, axes: tuple[str, ...]) -> dict[str, TensorSpec]:
    """The per-frequency and per-pair curves of `posenc.models.properties.axes.axis_measures`."""
    return {"inv_freq": TensorSpec((freqs,), F32), "wavelength": TensorSpec((freqs,), F64),
            "axis": TensorSpec((freqs,), I64), "completes_turn": TensorSpec((freqs,), BOOL),
            **{f"relativity_residual_{name}": TensorSpec((pairs,), F64) for name in axes},
            "norm_ratio": TensorSpec((pairs,), F64)}


def axis_panels(t: Mapping[str, np.ndarray], axes: tuple[str, ...], dtype: str) -> tuple[Panel, ...]:
    index = np.arange(t["wavelength"].size)
    return (
        Panel("wavelength 2π/θ_i per axis", "frequency index i", "positions",
              tuple(Curve(index[t["axis"] == a], t["wavelength"][t["axis"] == a], name, "points")
                    for a, name in enumerate(axes)), logy=True),
        Panel(f"relativity residual per axis ({dtype} table)", "random pair", "|⟨R q, R k⟩ − ⟨q, R k⟩| / ‖q‖‖k‖",
              tuple(Curve(np.arange(t[f"relativity_residual_{name}"].size), t[f"relativity_residual_{name}"], name,
                          "points") for name in axes)),
    )


class VisionPropertiesQuery(table_fields(VisionRopeQuery, exclude=("form",))):  # type: ignore[misc]  # dynamic base
    """Per axis (height, width): wavelengths against the patches along it and the relativity residual;
    the exact distance between any two patches' rows against (Δh, Δw) and its minimum, the first exact
    collision of served rows, norm preservation (Llama 4: also the CLS row's nearest patch)."""

    endpoint = "properties/rope/vision"
    preset_table = "vision_rope"
    tensors = ("inv_freq", "wavelength", "axis", "completes_turn", "relativity_residual_height",
               "relativity_residual_width", "norm_ratio", "pair_distance")

    head_dim: int = documented_within(VisionRopeQuery, "head_dim", PROPERTY_WIDTH, VISION_RULE)
    height: int | None = documented_within(VisionRopeQuery, "height", VISION_SIDE, VISION_RULE)
    width: int | None = documented_within(VisionRopeQuery, "width", VISION_SIDE, VISION_RULE)
    pairs: int = Pairs
    seed: int = Seed

    @cached_property
    def table(self) -> VisionRopeQuery:
        """The table route's query (form at its default)."""
        return VisionRopeQuery.model_validate(self.model_dump(exclude={"pairs", "seed"}))

    def check(self) -> None:
        self.table.check()
        rows = vision_rows(self.model, *self.table.grid)
        check_rows("height × width", rows)
        check_work(rows, self.pairs, self.head_dim, "head_dim", "height × width")

    def params(self) -> dict[str, Any]:
        return {**self.table.params(), "form": None, "pairs": self.pairs, "seed": self.seed}

    def specs(self) -> dict[str, TensorSpec]:
        height, width = self.table.grid
        return {**axis_specs(self.head_dim // 2, self.pairs, VISION_AXES),
                "pair_distance": TensorSpec((height, width), F64)}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        rows = vision_rows(self.model, *self.table.grid)
        return TableQuery.working_bytes(self, specs) + 40 * rows * self.head_dim + 64 * self.pairs * self.head_dim

    def compute(self) -> Bundle:
        curves, scalars = vision_properties(self.model, self.head_dim, self.rope_theta, *self.table.grid,
                                            np_dtype(self.dtype), self.pairs, self.seed)
        return Bundle(curves, summary(scalars))

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        return (*axis_panels(t, VISION_AXES, self.dtype),
                Heatmap("uniqueness: ‖row(p) − row(p + Δ)‖ (full form, exact)", t["pair_distance"], "Δh", "Δw",
                        "distance"))


class MropePropertiesQuery(PropertiesQuery, MropeQuery):
    """Per section (t, h, w): wavelengths against the positions that axis spans in this sequence and the
    relativity residual; the distinct positions and served rows, the distance between consecutive
    tokens' rows, and norm preservation."""

    endpoint = "properties/rope/mrope"
    tensors = ("inv_freq", "wavelength", "axis", "completes_turn", "relativity_residual_t", "relativity_residual_h",
               "relativity_residual_w", "norm_ratio", "adjacent_distance")  # type: ignore[assignment]  # curves

    pairs: int = Pairs
    seed: int = Seed

    def check(self) -> None:
        super().check()
        if self.upload is None:
            return
        check_rows("sequence length", self.length)
        check_work(self.length, self.pairs, self.head_dim, "head_dim", "sequence length")

    def specs(self) -> dict[str, TensorSpec]:
        return {**axis_specs(self.head_dim // 2, self.pairs, MROPE_AXES),
                "adjacent_distance": TensorSpec((self.length - 1,), F64)}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        rows_and_pairs = 48 * self.length * self.head_dim + 64 * self.pairs * self.head_dim
        return TableQuery.working_bytes(self, specs) + rows_and_pairs

    def compute(self) -> Bundle:
        ids, _ = self.position_ids()
        curves, scalars = mrope_properties(self.rope, ids, self.section, self.order, np_dtype(self.dtype),
                                           self.pairs, self.seed)
        return Bundle(curves, summary(scalars))

    def panels(self, t: Mapping[str, np.ndarray], params: Mapping[str, str]) -> tuple[Panel | Heatmap, ...]:
        tokens = np.arange(1, t["adjacent_distance"].size + 1)
        return (*axis_panels(t, MROPE_AXES, self.dtype),
                Panel(f"consecutive tokens' rows ({self.dtype})", "token", "‖row(s) − row(s − 1)‖",
                      (Curve(tokens, t["adjacent_distance"], None, "points"),)))


register_properties("/v1/properties/rope/vision", VisionPropertiesQuery,
                    summary="Vision 2-D RoPE: per-axis wavelengths and relativity, patch uniqueness, norm")
register_properties("/v1/properties/rope/mrope", MropePropertiesQuery,
                    summary="M-RoPE: per-section wavelengths and relativity, row uniqueness, norm, for a sequence")
