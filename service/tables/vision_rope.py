"""Vision-encoder 2-D RoPE, `GET /v1/rope/vision`: Pixtral and Llama 4 vision (docs/ENCODINGS.md §13); and the
per-tower tables `POST /v1/rope/from-config?tower=vision&grid_thw=t,h,w` answers for every vision tower
(`VisionTowerQuery`, docs/ENCODINGS.md §13.1)."""

import threading
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from pydantic import Field, PrivateAttr

from posenc.models.bounds import MAX_DIM, MAX_GRID, MAX_THETA
from posenc.models.dtypes import np_dtype
from posenc.models.errors import ParameterError
from posenc.models.vision_rope import (
    DEFAULT_VISION_ROPE_THETA,
    VISION_DEFAULTS,
    VisionForm,
    VisionRopeModel,
    check_vision_head_dim,
    vision_cos_sin,
    vision_layout,
    vision_rows,
)
from posenc.models.vision_towers import (
    VisionTower,
    check_grid,
    describe,
    tower_cos_sin,
    tower_positions,
    tower_rows,
    tower_width,
)
from posenc.service.codec.encode import Bundle
from posenc.service.tables.fields import FloatDTypeField
from posenc.service.tables.registry import FLOAT64_TEMPORARY, TableQuery, TensorSpec, register_table

# head_dim of a 2-D RoPE: two axes of head_dim / 4 frequencies each (`check_vision_head_dim`, and
# `check_tower_head_dim` of the axial towers); the OpenAPI document's multipleOf
AXES_HEAD_MULTIPLE = 4


class VisionRopeQuery(TableQuery):
    """Per-patch cos/sin of a vision encoder's axial RoPE. Pixtral: an height × width patch grid,
    row-major, equal to `PixtralVisionRotaryEmbedding` on the positions `PixtralVisionModel` builds.
    Llama 4: the fixed (image_size // patch_size)² grid plus the CLS row, equal to
    `Llama4VisionRotaryEmbedding.freqs_ci` (cos = real part, sin = imaginary part).
    """

    endpoint = "rope/vision"
    preset_table = "vision_rope"
    tensors = ("cos", "sin", "inv_freq")
    row_tensors: ClassVar[tuple[str, ...]] = ("cos", "sin")

    model: VisionRopeModel = Field("pixtral", description=(
        "pixtral (rotate_half layout) or llama4 (complex pairs: interleaved layout, CLS row last)."))
    head_dim: int = Field(ge=AXES_HEAD_MULTIPLE, le=MAX_DIM, json_schema_extra={"multipleOf": AXES_HEAD_MULTIPLE},
                          description=f"Vision attention head size (hidden_size // num_attention_heads), a multiple "
                                      f"of {AXES_HEAD_MULTIPLE}.")
    rope_theta: float = Field(DEFAULT_VISION_ROPE_THETA, gt=1, le=MAX_THETA, description="RoPE base.")
    image_size: int | None = Field(None, ge=1, le=MAX_GRID * 1024, description=(
        "Largest image side in pixels; not given: the config default (pixtral 1024, llama4 448)."))
    patch_size: int | None = Field(None, ge=1, le=1024, description=(
        "Patch side in pixels; not given: the config default (pixtral 16, llama4 14)."))
    height: int | None = Field(None, ge=1, le=MAX_GRID, description=(
        "pixtral: patch rows of the image (<= image_size // patch_size); not given: the maximum. "
        "llama4: the grid is fixed, leave it out."))
    width: int | None = Field(None, ge=1, le=MAX_GRID, description="pixtral: patch columns; as height.")
    form: VisionForm = Field("full", description=(
        "full: [rows, head_dim] in the model's layout; half: [rows, head_dim/2], one column per frequency."))
    dtype: FloatDTypeField = "float32"

    @property
    def resolved_image_size(self) -> int:
        return self.image_size or VISION_DEFAULTS[self.model]["image_size"]

    @property
    def resolved_patch_size(self) -> int:
        return self.patch_size or VISION_DEFAULTS[self.model]["patch_size"]

    @property
    def side(self) -> int:
        """Patches per side: image_size // patch_size."""
        side = self.resolved_image_size // self.resolved_patch_size
        if side < 1:
            raise ParameterError("patch_size", "must not exceed image_size")
        return side

    @property
    def grid(self) -> tuple[int, int]:
        side = self.side
        if self.model == "llama4":
            for name in ("height", "width"):
                if getattr(self, name) not in (None, side):
                    raise ParameterError(name, f"Llama 4's vision grid is fixed at image_size // patch_size = {side}")
            return side, side
        for name in ("height", "width"):
            value = getattr(self, name)
            if value is not None and value > side:
                raise ParameterError(name, f"at most image_size // patch_size = {side} patches, got {value}")
        return self.height or side, self.width or side

    def check(self) -> None:
        check_vision_head_dim(self.head_dim)
        self.grid  # noqa: B018 - resolving the grid is the check

    def params(self) -> dict[str, Any]:
        height, width = self.grid
        return {**self.model_dump(exclude={"height", "width", "image_size", "patch_size"}),
                "image_size": self.resolved_image_size, "patch_size": self.resolved_patch_size,
                "height": height, "width": width}

    def specs(self) -> dict[str, TensorSpec]:
        rows = vision_rows(self.model, *self.grid)
        width = self.head_dim if self.form == "full" else self.head_dim // 2
        out = np_dtype(self.dtype)
        return {"cos": TensorSpec((rows, width), out), "sin": TensorSpec((rows, width), out),
                "inv_freq": TensorSpec((self.head_dim // 2,), np_dtype("float32"))}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        # positions, angles, cos and sin in float64 over [rows, head_dim/2]
        return super().working_bytes(specs) + 4 * FLOAT64_TEMPORARY * specs["cos"].shape[0] * self.head_dim // 2

    def compute_rows(self, rows: slice | None) -> Bundle:
        cos, sin, freqs = vision_cos_sin(self.model, self.head_dim, self.rope_theta, *self.grid, self.form,
                                         np_dtype(self.dtype), rows)
        row_order = "patches row-major (h, w)" if self.model == "pixtral" else "patches row-major, then the CLS token"
        return Bundle({"cos": cos, "sin": sin, "inv_freq": freqs},
                      {"layout": vision_layout(self.model) if self.form == "full" else "per-frequency",
                       "rows": row_order, "columns": ("row (h) frequencies, then column (w)"
                                                      if self.model == "pixtral"
                                                      else "column (x) frequencies, then row (y)")})


register_table("/v1/rope/vision", VisionRopeQuery, summary="2-D RoPE of vision encoders (Pixtral, Llama 4 vision)",
               response_description="Tensors `cos`, `sin` [patches (+1 CLS for llama4), head_dim] (form=half: "
                                    "head_dim/2) and `inv_freq` [head_dim/2] float32 in column order.")


class VisionTowerQuery(TableQuery):
    """A vision tower's per-patch table for one image or video grid, as the tower passes it to its rotary
    application (`posenc.models.vision_towers`). Not a route of its own: `POST /v1/rope/from-config?tower=vision`
    builds it from the config (docs/ENCODINGS.md §13.1).
    """

    endpoint = "rope/from-config"
    tensors = ("cos", "sin", "inv_freq")
    row_tensors: ClassVar[tuple[str, ...]] = ("cos", "sin")

    vision_tower: str
    head_dim: int
    rope_theta: float
    merge_size: int
    window: int
    grid_thw: tuple[int, int, int]
    config_section: str
    class_pos_emb: tuple[float, ...] | None = None  # learned CLS angles the request gave
    form: VisionForm = "full"
    dtype: FloatDTypeField = "float32"

    _tower: Any = PrivateAttr(default=None)
    _positions: Any = PrivateAttr(default=None)  # the whole table's positions, shared by its row blocks
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    @property
    def resolved(self) -> VisionTower:
        """The tower with this query's values (the config was read once, by `from_config`)."""
        return self._tower

    def positions(self) -> np.ndarray:
        """`tower_positions` of the whole table, computed once for all its row blocks."""
        with self._lock:
            if self._positions is None:
                self._positions = tower_positions(self.resolved, self.grid_thw, self.merge_size)
            return self._positions

    @classmethod
    def of(cls, tower: VisionTower, grid_thw: tuple[int, int, int], merge_size: int | None, form: VisionForm,
           dtype: str) -> "VisionTowerQuery":
        scheme = tower.scheme
        if merge_size is not None and scheme.merge != "input":
            raise ParameterError("merge_size", f"{scheme.title}'s spatial merge comes from its config; leave out "
                                               "merge_size (VideoLLaMA3 only)")
        merge = tower.merge if merge_size is None else merge_size
        query = cls(vision_tower=scheme.name, head_dim=tower.head_dim, rope_theta=tower.rope_theta, merge_size=merge,
                    window=tower.window, grid_thw=grid_thw, config_section=tower.section or "top-level",
                    class_pos_emb=tower.cls_angles, form=form, dtype=dtype)
        query._tower = tower
        return query

    def check(self) -> None:
        check_grid(self.resolved, self.grid_thw, self.merge_size)

    def params(self) -> dict[str, Any]:
        return {**self.model_dump(), "tower": "vision", "grid_thw": ",".join(map(str, self.grid_thw))}

    def specs(self) -> dict[str, TensorSpec]:
        tower = self.resolved
        rows = tower_rows(tower, self.grid_thw, self.merge_size)
        out = np_dtype(self.dtype)
        width = tower_width(tower, self.form)
        n = tower_width(tower, "half")
        return {"cos": TensorSpec((rows, width), out), "sin": TensorSpec((rows, width), out),
                "inv_freq": TensorSpec((n,), np_dtype("float32"))}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        # positions [rows, 3] and angles, cos, sin in float64 over [rows, n]
        rows, n = specs["cos"].shape[0], specs["inv_freq"].shape[0]
        return super().working_bytes(specs) + FLOAT64_TEMPORARY * rows * (3 + 4 * n)

    def compute_rows(self, rows: slice | None) -> Bundle:
        tower = self.resolved
        cos, sin, freqs = tower_cos_sin(tower, self.grid_thw, self.merge_size, self.form, np_dtype(self.dtype), rows,
                                        self.positions())
        info = describe(tower, self.merge_size)
        if self.form == "half":
            info["layout"] = "per-angle"
        if tower.scheme.note:
            info["note"] = tower.scheme.note
        return Bundle({"cos": cos, "sin": sin, "inv_freq": freqs}, info)
