"""`POST /v1/rope/from-config`: the text model's RoPE (`posenc.service.tables.rope.RopeFromConfigQuery`), or a
vision tower's per-patch table (`posenc.service.tables.vision_rope`): every tower `posenc.models.vision_towers`
describes, for the image or video grid `grid_thw`; Pixtral and Llama 4 without `grid_thw` answer their full grid
as GET /v1/rope/vision does. docs/ENCODINGS.md §1.1, §13.
"""

from collections.abc import Mapping
from dataclasses import replace
from functools import cached_property
from typing import Any

from pydantic import Field, ValidationError

from posenc.models.bounds import MAX_GRID, MAX_MERGE
from posenc.models.errors import ParameterError
from posenc.models.vision_rope import VISION_MODEL_TYPES, Tower
from posenc.models.vision_towers import TOWERS, VisionTower, check_cls_angles, find_tower, tower_from_config
from posenc.service.codec.encode import Bundle
from posenc.service.errors import InvalidParameter
from posenc.service.tables.registry import TensorSpec, register_table
from posenc.service.tables.rope import RopeFromConfigQuery
from posenc.service.tables.vision_rope import VisionRopeQuery, VisionTowerQuery

KNOWN_VISION = ", ".join(sorted({t for scheme in TOWERS for t in scheme.model_types}))


class FromConfigQuery(RopeFromConfigQuery):
    """The RoPE a config.json describes, resolved exactly as transformers resolves it; the metadata holds every
    resolved value. Vision configs (a bare vision config, or a whole config.json with tower=vision) give the vision
    tower's per-patch table for the grid `grid_thw` (Pixtral and Llama 4 without it: their full grid). A tower
    whose CLS angles are a learned weight (MLCD, LLaVA-OneVision-1.5) answers its patch rows, or the full table when
    the body's top level holds the weight's values as `class_pos_emb`.
    """

    tower: Tower | None = Field(None, description=(
        "text: the language model's RoPE; vision: the vision tower's per-patch table, from a bare vision config or "
        "the whole config.json's vision config. Not given: vision for a bare vision config, else text."))
    grid_thw: str | None = Field(None, max_length=64, pattern=r"^\s*\d+\s*,\s*\d+\s*,\s*\d+\s*$", description=(
        "Vision: the image or video grid t,h,w in patches before any merge, as image_grid_thw / video_grid_thw "
        "(towers with a fixed grid: that grid when not given; Pixtral and Llama 4 without it: the full grid)."))
    merge_size: int | None = Field(None, ge=1, le=MAX_MERGE, description=(
        "Vision, VideoLLaMA3 only: the spatial merge size the tower is given (image_merge_sizes 1, "
        "video_merge_sizes 2); default 1."))

    @property
    def grid(self) -> tuple[int, int, int] | None:
        if self.grid_thw is None:
            return None
        t, h, w = (int(part) for part in self.grid_thw.split(","))
        for name, value in zip("thw", (t, h, w), strict=True):
            if not 1 <= value <= MAX_GRID:
                raise ParameterError("grid_thw", f"{name} must be in [1, {MAX_GRID}], got {value}")
        return t, h, w

    def _vision_config(self) -> tuple[Any, str]:
        """The upload, or its `config_section` when tower=vision names one (and the section's dotted path)."""
        if self.tower != "vision" or not self.config_section:
            return self.upload, ""
        node: Any = self.upload
        for key in self.config_section.split("."):
            node = node.get(key) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            raise ParameterError("config_section", f"the config has no object at {self.config_section!r}")
        return node, self.config_section

    @cached_property
    def vision(self) -> VisionRopeQuery | VisionTowerQuery | None:
        """The vision table this request asks for, or None for a text RoPE."""
        if self.tower == "text":
            if self.grid_thw is not None or self.merge_size is not None:
                raise ParameterError("grid_thw", "applies to tower=vision")
            return None
        config, prefix = self._vision_config()
        if not isinstance(config, Mapping) or find_tower(config, self.tower == "vision") is None:
            if self.tower == "vision":
                raise ParameterError("tower", "tower=vision needs a vision config, or a whole config whose vision "
                                              f"config is one of: {KNOWN_VISION}")
            if self.grid_thw is not None or self.merge_size is not None:
                raise ParameterError("grid_thw", "applies to vision configs (tower=vision for a whole config.json)")
            return None
        if self.max_position is not None or self.offset or self.layer_type is not None:
            raise InvalidParameter("max_position: a vision config's table has one row per patch of the grid; "
                                   "leave out max_position, offset and layer_type (grid_thw sets the rows)")
        tower = tower_from_config(config, True)
        assert tower is not None  # find_tower found it
        if prefix:
            tower = replace(tower, section=f"{prefix}.{tower.section}".rstrip("."))
        learned = self.upload.get("class_pos_emb")  # a learned CLS angle vector, beside the config (no config has it)
        if learned is not None:
            tower = replace(tower, cls_angles=check_cls_angles(tower, learned))
        if self.layout is not None and self.form == "full" and self.layout != tower.scheme.pairs:
            raise ParameterError("layout", f"{tower.scheme.title}'s pair layout is {tower.scheme.pairs}; leave out "
                                           "layout")
        if self.grid is None and self.merge_size is None and tower.scheme.model_types[0] in VISION_MODEL_TYPES:
            return self._full_grid(tower)
        grid = self.grid
        if grid is None:
            if tower.default_grid is None:
                raise ParameterError("grid_thw", f"{tower.scheme.title}: give the image or video grid t,h,w in "
                                                 "patches (as image_grid_thw)")
            grid = (1, *tower.default_grid)
        return VisionTowerQuery.of(tower, grid, self.merge_size, self.form, self.dtype)

    def _full_grid(self, tower: VisionTower) -> VisionRopeQuery:
        """Pixtral and Llama 4 without grid_thw: GET /v1/rope/vision's table of the full grid."""
        try:
            return VisionRopeQuery(model=VISION_MODEL_TYPES[tower.scheme.model_types[0]], head_dim=tower.head_dim,
                                   rope_theta=tower.rope_theta, image_size=tower.image_size,
                                   patch_size=tower.patch_size, form=self.form, dtype=self.dtype)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidParameter(f"{first['loc'][0]}: {first['msg']} (in the vision config)") from None

    @property
    def table(self) -> VisionRopeQuery | VisionTowerQuery | None:
        """The vision table this request asks for, once the body is there."""
        return None if self.upload is None else self.vision

    def check(self) -> None:
        vision = self.table
        if vision is None:
            super().check()
        else:
            vision.check()

    def params(self) -> dict[str, Any]:
        vision = self.table
        if vision is None:
            return super().params()
        return {**vision.params(), "tower": "vision"}

    def specs(self) -> dict[str, TensorSpec]:
        vision = self.table
        return super().specs() if vision is None else vision.specs()

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        vision = self.table
        return super().working_bytes(specs) if vision is None else vision.working_bytes(specs)

    def compute_rows(self, rows: slice | None) -> Bundle:
        vision = self.table
        return super().compute_rows(rows) if vision is None else vision.compute_rows(rows)


register_table("/v1/rope/from-config", FromConfigQuery,
               summary="RoPE cos/sin table from a Hugging Face config.json",
               response_description="Same tensors as GET /v1/rope (vision configs: the tower's per-patch `cos`, "
                                    "`sin` [patches (+ CLS rows), rotary width] for grid_thw, and `inv_freq` "
                                    "[angle columns] float32; Pixtral and Llama 4 without grid_thw: as GET "
                                    "/v1/rope/vision); metadata holds every resolved value.")
