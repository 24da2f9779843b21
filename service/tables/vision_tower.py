"""`GET /v1/rope/vision/tower`: a vision tower's per-patch table by its parameters, without a config upload: what
`POST /v1/rope/from-config?tower=vision&grid_thw=t,h,w` answers for that tower's config (`VisionTowerQuery`,
docs/ENCODINGS.md §13.1), and what `?preset=` fills for the vision-language models of the catalogue (Qwen2.5-VL,
Qwen3-VL, GLM-4.1V, PaddleOCR-VL, Gemma 4). Learned CLS rows (MLCD, LLaVA-OneVision-1.5) need the weight: only the
from-config route takes it (`class_pos_emb`); here, as there without it, the patch rows.

The towers served are those whose table depends on the grid and on head_dim, rope_theta, the spatial merge and
the window only (`GRID_TOWERS`); Pixtral and Llama 4 have `GET /v1/rope/vision`, the fixed-grid and SAM towers
and VideoLLaMA3 (a merge given per input) only the from-config route.
"""

from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

from pydantic import Field

from posenc.models.bounds import MAX_DIM, MAX_GRID, MAX_MERGE, MAX_THETA
from posenc.models.errors import ParameterError
from posenc.models.vision_rope import VisionForm
from posenc.models.vision_towers import TOWERS, TOWERS_BY_NAME, TowerScheme, VisionTower, check_tower_head_dim
from posenc.service.codec.encode import Bundle
from posenc.service.tables.fields import FloatDTypeField
from posenc.service.tables.registry import TableQuery, TensorSpec, register_table
from posenc.service.tables.vision_rope import AXES_HEAD_MULTIPLE, VisionTowerQuery


def _by_parameters(scheme: TowerScheme) -> bool:
    """A tower whose table is fixed by head_dim, rope_theta, the merge, the window and the grid."""
    return (scheme.grid == "input" and not scheme.max_grid and not scheme.position_scale and scheme.merge != "input"
            and scheme.window != "pos_emb_height")


GRID_TOWERS: tuple[str, ...] = tuple(scheme.name for scheme in TOWERS if _by_parameters(scheme))
IMAGE_TOWERS = tuple(scheme.title for scheme in TOWERS if scheme.name in GRID_TOWERS and scheme.video == "images")
# head_dim as the OpenAPI document states it: a value every tower of GRID_TOWERS takes (`check_tower_head_dim`: the
# two-axis towers a multiple of 4, the three-band one at least 6, the 1-D one even); the server's bound stays 4
TOWER_HEAD_DIM: dict[str, Any] = {"multipleOf": AXES_HEAD_MULTIPLE, "minimum": 2 * AXES_HEAD_MULTIPLE}
# grid_thw as the OpenAPI document states it: three positive numbers of fewer digits than MAX_GRID (within it)
_SIDE = rf"\s*0*[1-9]\d{{0,{len(str(MAX_GRID)) - 2}}}\s*"
GRID_THW_DOCUMENTED = f"^{_SIDE},{_SIDE},{_SIDE}$"


def default_window(scheme: TowerScheme, merge: int) -> int:
    """The window side in merged patches of the config class's defaults (window_size // merge // patch_size)."""
    if scheme.window != "window_size":
        return 0
    return max(1, scheme.defaults["window_size"] // merge // scheme.defaults["patch_size"])


class VisionTowerTableQuery(TableQuery):
    """A vision tower's cos/sin per patch of the grid `grid_thw`, rows in the order its attention sees them, equal
    to `POST /v1/rope/from-config?tower=vision&grid_thw=` of a config with these values."""

    endpoint = "rope/vision/tower"
    preset_table = "vision_tower"
    tensors = ("cos", "sin", "inv_freq")
    row_tensors: ClassVar[tuple[str, ...]] = ("cos", "sin")

    vision_tower: str = Field(json_schema_extra={"enum": list(GRID_TOWERS)}, description=(
        "The tower, as from-config's metadata names it (the towers whose table these parameters fix)."))
    head_dim: int = Field(ge=4, le=MAX_DIM, json_schema_extra=TOWER_HEAD_DIM, description=(
        "Vision attention head size (the vision config's hidden_size // num_heads, or its head_dim). This document "
        f"states a head every tower takes, a multiple of {AXES_HEAD_MULTIPLE} from {TOWER_HEAD_DIM['minimum']}; a "
        "tower's own rule may take more (the two-axis towers: any multiple of 4; a 1-D table: any even size)."))
    rope_theta: float | None = Field(None, gt=1, le=MAX_THETA, description=(
        "The vision rotary base; not given: the tower's config class default."))
    spatial_merge_size: int | None = Field(None, ge=1, le=MAX_MERGE, description=(
        "The vision config's spatial_merge_size (row order in merge × merge blocks); not given: the config class "
        "default. Towers without a spatial merge: 1."))
    window: int | None = Field(None, ge=0, le=MAX_GRID, description=(
        "Window attention towers (Qwen2.5-VL, Qwen2.5-Omni, EXAONE 4.5, Ovis2.5): the window side in merged "
        "patches, window_size // spatial_merge_size // patch_size; not given: the config class default's. "
        "Other towers: 0."))
    grid_thw: str = Field(max_length=64, pattern=r"^\s*\d+\s*,\s*\d+\s*,\s*\d+\s*$",
                          json_schema_extra={"pattern": GRID_THW_DOCUMENTED}, description=(
        f"The image or video grid t,h,w in patches before any merge, as image_grid_thw / video_grid_thw: each in "
        f"[1, {MAX_GRID}] (this document's pattern: up to {len(str(MAX_GRID)) - 1} digits), h and w multiples of "
        "the spatial merge; image towers (" + ", ".join(IMAGE_TOWERS) + "): t = 1."))
    form: VisionForm = Field("full", description=(
        "full: [rows, rotary width] in the tower's pair layout; half: one column per angle."))
    dtype: FloatDTypeField = "float32"

    @cached_property
    def table(self) -> VisionTowerQuery:
        """The from-config route's tower query for these values."""
        scheme = TOWERS_BY_NAME.get(self.vision_tower)
        if scheme is None or self.vision_tower not in GRID_TOWERS:
            raise ParameterError("vision_tower", f"one of {', '.join(GRID_TOWERS)}, got {self.vision_tower[:64]!r}")
        check_tower_head_dim(scheme, self.head_dim)
        if scheme.merge == "config":
            merge = self.spatial_merge_size or scheme.defaults["spatial_merge_size"]
        elif self.spatial_merge_size not in (None, 1):
            raise ParameterError("spatial_merge_size", f"{scheme.title}'s table has no spatial merge; leave it out")
        else:
            merge = 1
        window = default_window(scheme, merge) if self.window is None else self.window
        if scheme.window != "window_size" and window:
            raise ParameterError("window", f"{scheme.title} has no window attention; leave out window")
        if scheme.window == "window_size" and window < 1:
            raise ParameterError("window", "must be at least 1 merged patch")
        t, h, w = (int(part) for part in self.grid_thw.split(","))
        for name, value in zip("thw", (t, h, w), strict=True):
            if not 1 <= value <= MAX_GRID:
                raise ParameterError("grid_thw", f"{name} must be in [1, {MAX_GRID}], got {value}")
        theta = scheme.default_theta if self.rope_theta is None else self.rope_theta
        tower = VisionTower(scheme, self.head_dim, float(theta), merge, window, None, None, 0, "")
        return VisionTowerQuery.of(tower, (t, h, w), None, self.form, self.dtype)

    def check(self) -> None:
        self.table.check()

    def params(self) -> dict[str, Any]:
        table = self.table
        return {"vision_tower": table.vision_tower, "head_dim": table.head_dim, "rope_theta": table.rope_theta,
                "spatial_merge_size": table.merge_size, "window": table.window,
                "grid_thw": ",".join(map(str, table.grid_thw)), "form": self.form, "dtype": self.dtype}

    def specs(self) -> dict[str, TensorSpec]:
        return self.table.specs()

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        return self.table.working_bytes(specs)

    def compute_rows(self, rows: slice | None) -> Bundle:
        return self.table.compute_rows(rows)


register_table("/v1/rope/vision/tower", VisionTowerTableQuery,
               summary="A vision tower's per-patch RoPE table for an image or video grid (Qwen2.5-VL, Qwen3-VL, "
                       "GLM-4.1V, PaddleOCR-VL...)",
               response_description="Tensors `cos`, `sin` [patches (+ CLS rows), rotary width] and `inv_freq` "
                                    "[angle columns] float32, as POST /v1/rope/from-config?tower=vision answers "
                                    "for the same grid.")
