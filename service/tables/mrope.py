"""Multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): `POST /v1/rope/mrope/positions` (the 3-D position ids
of a described sequence) and `POST /v1/rope/mrope` (cos/sin for described or given position ids).
docs/ENCODINGS.md §8.

The body is JSON: `segments` (text runs, images, videos), optionally `sequence_length` / `padding_side`,
or (cos/sin only) explicit `position_ids` [3, S]. The model's parameters are the query string, as for every
table. The math is `posenc.models.mrope`.
"""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posenc.models.bounds import (
    DEFAULT_ROPE_THETA,
    MAX_DIM,
    MAX_GRID,
    MAX_MERGE,
    MAX_POSITION_ID,
    MAX_SCALE,
    MAX_SEGMENTS,
    MAX_SEQUENCE,
    MAX_THETA,
)
from posenc.models.dtypes import np_dtype
from posenc.models.errors import ParameterError
from posenc.models.mrope import (
    DEFAULT_MROPE_SECTION,
    DEFAULT_PADDING_SIDE,
    DEFAULT_SECOND_PER_GRID,
    DEFAULT_SPATIAL_MERGE_SIZE,
    DEFAULT_TOKENS_PER_SECOND,
    INTERLEAVED_MODELS,
    MropeModel,
    PaddingSide,
    SectionOrder,
    Segment,
    check_mrope_section,
    check_segments,
    mrope_cos_sin,
    mrope_position_ids,
    section_order,
    segment_tokens,
)
from posenc.models.rope import Layout
from posenc.models.rope_params import RopeParameters, make_rope_parameters
from posenc.service.codec.encode import Bundle
from posenc.service.errors import BadRequest, InvalidParameter
from posenc.service.tables.fields import FloatDTypeField, IntDTypeField
from posenc.service.tables.registry import FLOAT64_TEMPORARY, Body, TableQuery, TensorSpec, register_table

MAX_SEQUENCE_BODY_BYTES = 16 << 20  # explicit position ids of a long sequence: ~3 · 8 digits per token

GridSide = Annotated[int, Field(ge=1, le=MAX_GRID)]


class SegmentBody(BaseModel):
    """One segment of the described sequence."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["text", "image", "video"]
    length: int | None = Field(None, ge=1, le=MAX_SEQUENCE, description="text: number of tokens.")
    grid_thw: tuple[GridSide, GridSide, GridSide] | None = Field(None, description=(
        "image/video: patch grid (t, h, w) before the spatial merge, as image_grid_thw / video_grid_thw."))
    second_per_grid: float | None = Field(None, ge=0, le=MAX_SCALE, description=(
        "video, qwen2_5_vl: seconds per temporal grid step (second_per_grid_ts); "
        f"default {DEFAULT_SECOND_PER_GRID:g}."))

    def segment(self, index: int) -> Segment:
        if self.type == "text":
            if self.length is None or self.grid_thw is not None:
                raise ParameterError(f"segments[{index}]", "a text segment has `length` and no `grid_thw`")
            return Segment("text", length=self.length)
        if self.grid_thw is None or self.length is not None:
            raise ParameterError(f"segments[{index}]", f"an {self.type} segment has `grid_thw` and no `length`")
        if self.type == "image" and self.second_per_grid is not None:
            raise ParameterError(f"segments[{index}].second_per_grid", "applies to video segments only")
        spg = DEFAULT_SECOND_PER_GRID if self.second_per_grid is None else self.second_per_grid
        return Segment(self.type, grid_thw=self.grid_thw, second_per_grid=spg)


class SequenceBody(BaseModel):
    """A sequence description, or explicit position ids (cos/sin only)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    segments: list[SegmentBody] | None = Field(None, max_length=MAX_SEGMENTS)
    sequence_length: int | None = Field(None, ge=1, le=MAX_SEQUENCE, description=(
        "Tokens in the row, padding included; default: the segments' tokens."))
    padding_side: PaddingSide = DEFAULT_PADDING_SIDE
    position_ids: list[list[Annotated[int, Field(ge=0, le=MAX_POSITION_ID)]]] | None = Field(
        None, min_length=3, max_length=3, description="Explicit [3, S] position ids (t, h, w rows).")


@dataclass(frozen=True)
class SequenceUpload:
    """The decoded body: segments (with padding) or explicit position ids int64 [3, S]; `digest` keys it."""

    segments: tuple[Segment, ...] | None
    sequence_length: int | None
    padding_side: PaddingSide
    position_ids: np.ndarray | None
    digest: str


def _field_path(loc: tuple[int | str, ...]) -> str:
    """("segments", 2, "grid_thw", 0) → "segments[2].grid_thw[0]"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _json_object(body: bytes) -> Any:
    """The body parsed as a JSON object (400 when it is not one)."""
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the body must be a JSON object describing the sequence: {exc}") from None
    except RecursionError:
        raise BadRequest("the body is nested too deeply") from None
    if not isinstance(document, dict):
        raise BadRequest(f"the body must be a JSON object (segments or position_ids), got {type(document).__name__}")
    return document


def decode_sequence(body: bytes, content_type: str | None) -> SequenceUpload:
    """The JSON body validated (422 naming the field: `segments[2].grid_thw`, ...)."""
    document = _json_object(body)
    try:
        parsed = SequenceBody.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidParameter(f"{_field_path(tuple(first['loc']))}: {first['msg']}") from None
    if (parsed.segments is None) == (parsed.position_ids is None):
        raise InvalidParameter("segments: give either `segments` (a sequence description) or `position_ids`")
    digest = hashlib.sha256(json.dumps(parsed.model_dump(), sort_keys=True).encode()).hexdigest()
    if parsed.position_ids is not None:
        if parsed.sequence_length is not None:
            raise InvalidParameter("sequence_length: applies to `segments` only")
        if len({len(row) for row in parsed.position_ids}) != 1 or not parsed.position_ids[0]:
            raise InvalidParameter("position_ids: must be three rows (t, h, w) of the same non-zero length")
        ids = np.asarray(parsed.position_ids, dtype=np.int64)  # [3, S]
        return SequenceUpload(None, None, parsed.padding_side, ids, digest)
    segments = tuple(seg.segment(i) for i, seg in enumerate(parsed.segments or ()))
    return SequenceUpload(segments, parsed.sequence_length, parsed.padding_side, None, digest)


def _body(description: str) -> Body:
    return Body(decode=decode_sequence, limit=MAX_SEQUENCE_BODY_BYTES, openapi={
        "requestBody": {
            "required": True,
            "description": description,
            "content": {"application/json": {"schema": SequenceBody.model_json_schema()}},
        }
    })


SEGMENTS_DOC = ("`segments`: a list of `{\"type\": \"text\", \"length\": n}`, `{\"type\": \"image\", \"grid_thw\": "
                "[t, h, w]}` and `{\"type\": \"video\", \"grid_thw\": [t, h, w], \"second_per_grid\": s}` in "
                "sequence order (vision_start/end tokens are text); optional `sequence_length` (padding "
                "included) and `padding_side` (left).")


class MropeSequenceQuery(TableQuery):
    """What both M-RoPE routes share: the model family and its vision parameters, and the sequence body."""

    preset_table = "multimodal_rope"

    model: MropeModel = Field("qwen2_vl", description=(
        "Model family: qwen2_vl, qwen2_5_vl (videos spaced by tokens_per_second · second_per_grid), qwen3_vl "
        "(one video segment per frame; interleaved sections)."))
    spatial_merge_size: int = Field(DEFAULT_SPATIAL_MERGE_SIZE, ge=1, le=MAX_MERGE,
                                    description="vision_config.spatial_merge_size.")
    tokens_per_second: float = Field(DEFAULT_TOKENS_PER_SECOND, ge=0, le=MAX_SCALE, description=(
        "vision_config.tokens_per_second (qwen2_5_vl videos only; transformers' default "
        f"{DEFAULT_TOKENS_PER_SECOND:g})."))

    @property
    def sequence(self) -> SequenceUpload:
        upload: SequenceUpload = self.upload
        return upload

    def check(self) -> None:
        if self.upload is None:  # before the body is read there is nothing to check yet
            return
        seq = self.sequence
        if seq.segments is not None:
            tokens = check_segments(seq.segments, self.model, self.spatial_merge_size)
            if tokens > MAX_SEQUENCE:
                raise InvalidParameter(f"segments: {tokens} tokens; at most {MAX_SEQUENCE}")
            if seq.sequence_length is not None and tokens > seq.sequence_length:
                raise InvalidParameter(f"segments: the segments hold {tokens} tokens, more than "
                                       f"sequence_length {seq.sequence_length}")

    @property
    def length(self) -> int:
        """S, from the body alone."""
        seq = self.sequence
        if seq.position_ids is not None:
            return int(seq.position_ids.shape[1])
        tokens = sum(segment_tokens(s, self.spatial_merge_size) for s in seq.segments or ())
        return seq.sequence_length or tokens

    def params(self) -> dict[str, Any]:
        seq = self.sequence
        uses_tps = self.model == "qwen2_5_vl" and seq.position_ids is None
        return {**self.model_dump(exclude={"tokens_per_second"}),
                "tokens_per_second": self.tokens_per_second if uses_tps else None,
                "sequence_length": self.length, "padding_side": seq.padding_side if seq.segments else None,
                "sequence_sha256": seq.digest}

    def position_ids(self) -> tuple[np.ndarray, int | None]:
        """int64 [3, S] and the rope_delta (None for explicit ids)."""
        seq = self.sequence
        if seq.position_ids is not None:
            return seq.position_ids, None
        return mrope_position_ids(seq.segments or (), self.model, self.spatial_merge_size, self.tokens_per_second,
                                  seq.sequence_length, seq.padding_side)


class MropePositionsQuery(MropeSequenceQuery):
    """The 3-D position ids [3, S] and rope_deltas [1] of one sequence, bit-exact with transformers 5.23
    `get_rope_index` (padding positions are 0). Decoding continues at cache_position + rope_deltas.
    """

    endpoint = "rope/mrope/positions"
    tensors = ("position_ids", "rope_deltas")
    body = _body("The sequence: " + SEGMENTS_DOC)

    dtype: IntDTypeField = "int64"

    def check(self) -> None:
        super().check()
        if self.upload is not None and self.sequence.segments is None:
            raise InvalidParameter("segments: this route builds position ids from `segments`")

    def specs(self) -> dict[str, TensorSpec]:
        out = np_dtype(self.dtype)
        return {"position_ids": TensorSpec((3, self.length), out), "rope_deltas": TensorSpec((1,), out)}

    def compute(self) -> Bundle:
        ids, delta = self.position_ids()
        out = np_dtype(self.dtype)
        return Bundle({"position_ids": ids.astype(out), "rope_deltas": np.array([delta], dtype=out)},
                      {"position_ids_layout": "rows t, h, w; columns the sequence"})


class MropeQuery(MropeSequenceQuery):
    """cos/sin [S, rotary_dim] that Qwen2-VL / Qwen2.5-VL (contiguous sections) and Qwen3-VL (interleaved)
    multiply q and k by (rotate_half layout), for described or given position ids.
    """

    endpoint = "rope/mrope"
    tensors = ("cos", "sin", "inv_freq")
    row_tensors: ClassVar[tuple[str, ...]] = ("cos", "sin")
    body = _body("The sequence (" + SEGMENTS_DOC + ") or explicit `position_ids` [3, S].")

    head_dim: int = Field(ge=2, le=MAX_DIM, description="Attention head size.")
    partial_rotary_factor: float | None = Field(None, gt=0, le=1, description=(
        "Fraction of head_dim that is rotated (Qwen3.5): rotary_dim = int(head_dim * factor), even. Not given: 1.0."))
    rope_theta: float = Field(DEFAULT_ROPE_THETA, gt=1, le=MAX_THETA, description="RoPE base.")
    mrope_section: str | None = Field(None, max_length=64, description=(
        "t,h,w frequency counts summing to rotary_dim/2. Not given: the model's default (qwen2_vl, qwen2_5_vl "
        "16,24,24; qwen3_vl 24,20,20)."))
    interleaved: bool | None = Field(None, description=(
        "Interleave the sections (Qwen3-VL) instead of contiguous (Qwen2-VL). Not given: by model or section_order."))
    section_order: SectionOrder | None = Field(None, description=(
        "How the sections share out the frequencies: contiguous (Qwen2-VL: t, h, w blocks), interleaved (Qwen3-VL: "
        "T H W T H W ...), alternating_hw (ERNIE-4.5-VL: sections h, w, t; the first h + w frequencies alternate h, w, "
        "the rest follow t). Not given: interleaved if `interleaved`, else by model."))
    layout: Layout = Field("half", description=(
        "Channel pairing of cos/sin: half = cat(freqs, freqs) as rotate_half (Qwen-VL, GLM-4V); interleaved = each "
        "frequency twice in a row (ERNIE-4.5-VL, GLM-OCR)."))
    dtype: FloatDTypeField = "float32"

    @cached_property
    def rope(self) -> RopeParameters:
        return make_rope_parameters(head_dim=self.head_dim, rope_theta=self.rope_theta,
                                    partial_rotary_factor=self.partial_rotary_factor)

    @cached_property
    def section(self) -> tuple[int, int, int]:
        if self.mrope_section is None:
            return DEFAULT_MROPE_SECTION[self.model]
        try:
            values = [int(v) for v in self.mrope_section.split(",")]
        except ValueError:
            raise InvalidParameter("mrope_section: must be three comma-separated integers (t,h,w)") from None
        return check_mrope_section(values, self.rope.n_frequencies, self.order)

    @property
    def order(self) -> SectionOrder:
        if self.section_order is not None:
            if self.interleaved is not None and self.interleaved != (self.section_order == "interleaved"):
                raise InvalidParameter(f"interleaved: {str(self.interleaved).lower()} contradicts section_order "
                                       f"{self.section_order}; give one of them")
            return self.section_order
        interleaved = self.model in INTERLEAVED_MODELS if self.interleaved is None else self.interleaved
        return section_order(interleaved)

    @property
    def is_interleaved(self) -> bool:
        return self.order == "interleaved"

    def check(self) -> None:
        check_mrope_section(self.section, self.rope.n_frequencies, self.order)
        super().check()

    def params(self) -> dict[str, Any]:
        return {**super().params(), "mrope_section": list(self.section), "interleaved": self.is_interleaved,
                "section_order": self.order}

    def specs(self) -> dict[str, TensorSpec]:
        out = np_dtype(self.dtype)
        width = self.rope.rotary_dim
        return {"cos": TensorSpec((self.length, width), out), "sin": TensorSpec((self.length, width), out),
                "inv_freq": TensorSpec((self.rope.n_frequencies,), np_dtype("float32"))}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        # positions, angles, cos and sin in float64 over [S, rotary_dim/2]
        return super().working_bytes(specs) + 4 * FLOAT64_TEMPORARY * specs["cos"].size // 2

    @cached_property
    def resolved_ids(self) -> tuple[np.ndarray, int | None]:
        """`position_ids()`, built once for every row block."""
        return self.position_ids()

    def compute_rows(self, rows: slice | None) -> Bundle:
        ids, delta = self.resolved_ids
        cos, sin, inv_freq, factor = mrope_cos_sin(self.rope, ids, self.section, self.order,
                                                   np_dtype(self.dtype), rows, self.layout)
        metadata = {"attention_factor": repr(factor), "layout": self.layout}
        if delta is not None:
            metadata["rope_deltas"] = str(delta)
        return Bundle({"cos": cos, "sin": sin, "inv_freq": inv_freq}, metadata)


register_table("/v1/rope/mrope/positions", MropePositionsQuery,
               summary="M-RoPE 3-D position ids of a text/image/video sequence (Qwen2-VL family)",
               response_description="Tensors `position_ids` [3, S] (rows t, h, w) and `rope_deltas` [1].")
register_table("/v1/rope/mrope", MropeQuery, summary="M-RoPE cos/sin for a sequence (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)",
               response_description="Tensors `cos`, `sin` [S, rotary_dim] in the requested layout and dtype, and "
                                    "`inv_freq` [rotary_dim/2] float32.")
