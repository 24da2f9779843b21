"""`POST /v1/rope/from-config`: the text model's RoPE (`posenc.service.tables.rope.RopeFromConfigQuery`), or the
vision encoder's 2-D RoPE for Pixtral / Llama 4 vision configs (`posenc.service.tables.vision_rope`).
docs/ENCODINGS.md §1.1, §13.
"""

from collections.abc import Mapping
from functools import cached_property
from typing import Any

from pydantic import Field, ValidationError

from posenc.models.vision_rope import Tower, vision_rope_from_config
from posenc.service.codec.encode import Bundle
from posenc.service.errors import InvalidParameter
from posenc.service.tables.registry import TensorSpec, register_table
from posenc.service.tables.rope import RopeFromConfigQuery
from posenc.service.tables.vision_rope import VisionRopeQuery


class FromConfigQuery(RopeFromConfigQuery):
    """The RoPE a config.json describes, resolved exactly as transformers 5.23 resolves it; the metadata
    holds every resolved value. Vision configs (model_type pixtral or llama4_vision_model, or a wrapper's
    `vision_config` with tower=vision) give the per-patch table of GET /v1/rope/vision for the full grid.
    """

    tower: Tower | None = Field(None, description=(
        "text: the language model's RoPE; vision: the vision encoder's (Pixtral, Llama 4), from a bare vision "
        "config or the wrapper's vision_config. Not given: vision for a bare vision config, else text."))

    @cached_property
    def vision(self) -> VisionRopeQuery | None:
        """The equivalent GET /v1/rope/vision query, or None for a text RoPE."""
        found = vision_rope_from_config(self.upload, self.tower)
        if found is None:
            return None
        if self.max_position is not None or self.offset or self.layer_type is not None:
            raise InvalidParameter("max_position: a vision config's table has one row per patch of the full grid; "
                                   "leave out max_position, offset and layer_type (GET /v1/rope/vision for a "
                                   "smaller grid)")
        try:
            return VisionRopeQuery(model=found.model, head_dim=found.head_dim, rope_theta=found.rope_theta,
                                   image_size=found.image_size, patch_size=found.patch_size, form=self.form,
                                   dtype=self.dtype)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidParameter(f"{first['loc'][0]}: {first['msg']} (in the vision config)") from None

    @property
    def table(self) -> VisionRopeQuery | None:
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
               response_description="Same tensors as GET /v1/rope (vision configs: as GET /v1/rope/vision); "
                                    "metadata holds every resolved value.")
