"""Multimodal RoPE (M-RoPE) of Qwen2-VL, Qwen2.5-VL and Qwen3-VL: 3-D position ids and their cos/sin.

Reference: transformers 5.23.0 `models/qwen2_vl/modeling_qwen2_vl.py` (`Qwen2VLModel.get_rope_index`,
`get_vision_position_ids`, `Qwen2VLRotaryEmbedding`), `models/qwen2_5_vl/modeling_qwen2_5_vl.py` (video
temporal spacing by `tokens_per_second * second_per_grid`) and `models/qwen3_vl/modeling_qwen3_vl.py`
(videos split into one-frame grids, interleaved sections); docs/ENCODINGS.md §8.

A sequence is a list of segments: text runs, images and videos (patch grids t, h, w before the spatial
merge). Text tokens get the same position on all three axes; a vision segment of t·(h/m)·(w/m) tokens gets
(temporal, height, width) indices offset by the running position, which then advances by max(h, w)/m.

Numpy only: no torch, no HTTP.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from posenc.models.architectures import PairLayout
from posenc.models.dtypes import cast
from posenc.models.errors import ParameterError
from posenc.models.rope_params import RopeParameters
from posenc.models.rope_types import F32, rope_type_spec
from posenc.models.row_blocks import table_rows

MropeModel = Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
SegmentKind = Literal["text", "image", "video"]
# How the sections share out the frequencies (`mrope_axis`).
SectionOrder = Literal["contiguous", "interleaved", "alternating_hw"]
PaddingSide = Literal["left", "right"]

# The rotary modules' defaults when a config has no mrope_section.
DEFAULT_MROPE_SECTION: dict[str, tuple[int, int, int]] = {
    "qwen2_vl": (16, 24, 24), "qwen2_5_vl": (16, 24, 24), "qwen3_vl": (24, 20, 20),
}
# Qwen3-VL interleaves the sections (T H W T H W ...); Qwen2-VL and Qwen2.5-VL keep them contiguous.
INTERLEAVED_MODELS = frozenset({"qwen3_vl"})
# transformers' defaults: vision_config.spatial_merge_size, vision_config.tokens_per_second (Qwen2.5-VL) and a
# video's second_per_grid_ts when the processor gives none; padding goes left, as batched generation pads.
DEFAULT_SPATIAL_MERGE_SIZE = 2
DEFAULT_TOKENS_PER_SECOND = 4.0
DEFAULT_SECOND_PER_GRID = 1.0
DEFAULT_PADDING_SIDE: PaddingSide = "left"


@dataclass(frozen=True)
class Segment:
    """One run of the sequence: `length` text tokens, or an image/video patch grid (t, h, w).

    `second_per_grid`: seconds per temporal grid step of a video (Qwen2.5-VL only; default 1).
    """

    kind: SegmentKind
    length: int = 0
    grid_thw: tuple[int, int, int] = (0, 0, 0)
    second_per_grid: float = DEFAULT_SECOND_PER_GRID


def segment_tokens(segment: Segment, spatial_merge_size: int) -> int:
    """Tokens a segment occupies in the language model's sequence."""
    if segment.kind == "text":
        return segment.length
    t, h, w = segment.grid_thw
    return t * (h // spatial_merge_size) * (w // spatial_merge_size)


def check_segments(segments: Sequence[Segment], model: MropeModel, spatial_merge_size: int) -> int:
    """Validate a sequence description; return its token count.

    Refused (ParameterError naming `segments[i]...`): no segment, non-positive sizes, h or w not divisible
    by the merge size, two vision segments of one kind in a row (the reference groups consecutive tokens of
    one modality and would read them as one grid: the processor always puts vision_start/end text between),
    and, for qwen3_vl, videos with t > 1 (frames are separated by timestamp text there: one segment each).
    """
    if not segments:
        raise ParameterError("segments", "at least one segment is required")
    if spatial_merge_size < 1:
        raise ParameterError("spatial_merge_size", f"must be >= 1, got {spatial_merge_size}")
    total = 0
    for i, seg in enumerate(segments):
        name = f"segments[{i}]"
        if seg.kind == "text":
            if seg.length < 1:
                raise ParameterError(f"{name}.length", f"must be >= 1, got {seg.length}")
        else:
            if any(n < 1 for n in seg.grid_thw):
                raise ParameterError(f"{name}.grid_thw", f"t, h and w must be >= 1, got {list(seg.grid_thw)}")
            t, h, w = seg.grid_thw
            if h % spatial_merge_size or w % spatial_merge_size:
                raise ParameterError(f"{name}.grid_thw", f"h and w must be multiples of spatial_merge_size "
                                                         f"{spatial_merge_size}, got h={h}, w={w}")
            if model == "qwen3_vl" and seg.kind == "video" and t != 1:
                raise ParameterError(f"{name}.grid_thw", "qwen3_vl separates video frames by timestamp text: "
                                                         f"give each frame as a video segment with t=1, got t={t}")
            if not seg.second_per_grid >= 0:
                raise ParameterError(f"{name}.second_per_grid", f"must be >= 0, got {seg.second_per_grid}")
            if i and segments[i - 1].kind == seg.kind:
                raise ParameterError(name, f"two {seg.kind} segments in a row read as one grid in the reference; "
                                           "separate them with text tokens (vision_start/vision_end)")
        total += segment_tokens(seg, spatial_merge_size)
    return total


def _vision_positions(start: int, grid_thw: tuple[int, int, int], spatial_merge_size: int,
                      time_interval: np.float32 | None) -> np.ndarray:
    """`get_vision_position_ids(start, grid, 1, merge, time_interval)` → int64 [3, t·(h/m)·(w/m)]."""
    t, h, w = grid_thw[0], grid_thw[1] // spatial_merge_size, grid_thw[2] // spatial_merge_size
    if time_interval is None:
        temporal = np.arange(t, dtype=np.int64)
    else:
        # torch: int64 arange * float32 scalar → float32 tensor, then .long() truncates
        temporal = (np.arange(t).astype(F32) * time_interval).astype(np.int64)
    grid_t, grid_h, grid_w = np.meshgrid(temporal + start, np.arange(h) + start, np.arange(w) + start,
                                         indexing="ij")  # each [t, h/m, w/m]
    return np.stack([grid_t, grid_h, grid_w]).reshape(3, -1).astype(np.int64)  # [3, t·h·w/m²]


def mrope_position_ids(
    segments: Sequence[Segment],
    model: MropeModel,
    spatial_merge_size: int = DEFAULT_SPATIAL_MERGE_SIZE,
    tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND,
    sequence_length: int | None = None,
    padding_side: PaddingSide = DEFAULT_PADDING_SIDE,
) -> tuple[np.ndarray, int]:
    """The 3-D position ids int64 [3, S] and rope_delta of one sequence, as `get_rope_index` builds them.

    S = `sequence_length` (default: the segments' tokens); extra tokens are padding on `padding_side`,
    position 0 (the reference's `attention_mask` zeros, left untouched). rope_delta = max position + 1 −
    unpadded length: decoding continues at position cache_position + rope_delta on all three axes.
    Videos: Qwen2.5-VL spaces temporal indices by tokens_per_second · second_per_grid (both rounded to
    float32 as the processor's tensor is, product and index in float32, truncated); Qwen2-VL and Qwen3-VL
    by 1.
    """
    tokens = check_segments(segments, model, spatial_merge_size)
    length = tokens if sequence_length is None else sequence_length
    if tokens > length:
        raise ParameterError("segments", f"the segments hold {tokens} tokens, more than sequence_length {length}")
    parts: list[np.ndarray] = []
    current = 0
    for seg in segments:
        if seg.kind == "text":
            parts.append(np.broadcast_to(np.arange(seg.length, dtype=np.int64) + current, (3, seg.length)))
            current += seg.length
            continue
        interval = None
        if model == "qwen2_5_vl" and seg.kind == "video":
            # the processor's second_per_grid_ts is a float32 tensor: tokens_per_second * it is float32
            interval = F32(tokens_per_second) * F32(seg.second_per_grid)
        parts.append(_vision_positions(current, seg.grid_thw, spatial_merge_size, interval))
        # the running position advances by the larger merged side, whatever the temporal indices reached
        current += max(seg.grid_thw[1], seg.grid_thw[2]) // spatial_merge_size
    positions = np.concatenate(parts, axis=1)  # [3, tokens]
    rope_delta = int(positions.max()) + 1 - tokens
    out = np.zeros((3, length), dtype=np.int64)  # [3, S]
    start = length - tokens if padding_side == "left" else 0
    out[:, start:start + tokens] = positions
    return out, rope_delta


def section_order(order: SectionOrder | bool) -> SectionOrder:
    """`order`, with the boolean `interleaved` of older callers read as interleaved / contiguous."""
    if isinstance(order, bool):
        return "interleaved" if order else "contiguous"
    return order


def check_mrope_section(section: Sequence[int], n_frequencies: int,
                        order: SectionOrder | bool = "contiguous") -> tuple[int, int, int]:
    """Three positive section sizes: summing to rotary_dim / 2 when contiguous or alternating (the module splits the
    frequencies by them); at most rotary_dim / 2 when interleaved (Qwen3.5 and Qwen4 interleave 32 of their
    frequencies; the ones past the sections follow t). Alternating (ERNIE-4.5-VL, sections h, w, t) needs h == w."""
    order = section_order(order)
    if len(section) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in section):
        raise ParameterError("mrope_section", f"must be three positive integers, got {list(section)}")
    total = sum(section)
    interleaved = order == "interleaved"
    if total > n_frequencies or (total != n_frequencies and not interleaved):
        rule = "sum to at most" if interleaved else "sum to"
        raise ParameterError("mrope_section", f"must {rule} rotary_dim/2 = {n_frequencies}, got "
                                              f"{list(section)} (sum {total})")
    if order == "alternating_hw" and section[0] != section[1]:
        raise ParameterError("mrope_section", f"alternating h/w sections must be equal (h, w, t), got {list(section)}")
    return section[0], section[1], section[2]


def check_xdrope_section(section: Sequence[int], n_frequencies: int) -> tuple[int, int, int, int]:
    """XD-RoPE's four positive section sizes (position, width, height, image index: HunyuanOCR's rotary module splits
    the frequencies by them), summing to rotary_dim / 2."""
    if len(section) != 4 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in section):
        raise ParameterError("mrope_section", f"must be four positive integers (XD-RoPE), got {list(section)[:8]}")
    if sum(section) != n_frequencies:
        raise ParameterError("mrope_section", f"must sum to rotary_dim/2 = {n_frequencies}, got {list(section)} "
                                              f"(sum {sum(section)})")
    return section[0], section[1], section[2], section[3]


def mrope_axis(section: Sequence[int], order: SectionOrder | bool, n_frequencies: int | None = None) -> np.ndarray:
    """Which position axis (0 t, 1 h, 2 w) drives each frequency → int64 [n_frequencies] (default sum(section)).

    contiguous (Qwen2-VL `recomposition_frequencies`, sections t, h, w): the first section[0] frequencies follow t,
    the next section[1] h, the last w. interleaved (Qwen3-VL): frequency j follows h when j % 3 == 1 and
    j < 3·section[1], w when j % 3 == 2 and j < 3·section[2], else t. alternating_hw (ERNIE-4.5-VL, sections h, w,
    t): the first section[0] + section[1] frequencies alternate h, w; the last section[2] follow t.
    """
    order = section_order(order)
    n = sum(section) if n_frequencies is None else n_frequencies
    if order == "contiguous":
        return np.repeat(np.arange(3), section)  # [n]
    j = np.arange(n)
    axis = np.zeros(n, dtype=np.int64)
    if order == "alternating_hw":
        hw = section[0] + section[1]
        axis[:hw] = 1 + j[:hw] % 2
        return axis
    axis[(j % 3 == 1) & (j < 3 * section[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * section[2])] = 2
    return axis


def mrope_cos_sin(
    params: RopeParameters,
    position_ids: np.ndarray,
    section: Sequence[int],
    order: SectionOrder | bool,
    dtype: npt.DTypeLike = np.float32,
    rows: slice | None = None,
    layout: PairLayout = "half",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """cos, sin [S, rotary_dim] for position ids [3, S]; also inv_freq, attention factor. `layout` pairs the channels
    as the model rotates them: half = cat(f, f) (rotate_half: Qwen-VL, GLM-4V), interleaved = each frequency twice in
    a row (ERNIE-4.5-VL, GLM-OCR). rotary_dim is `params.rotary_dim` (partial rotary: Qwen3.5 rotates part of the head).

    Frequency j uses the position of its axis (`mrope_axis`); as everywhere in posenc, angles and cos/sin
    are float64 from the float32 inv_freq, times the attention factor, cast once. Runtime-dependent
    rope_types see seq_len = max position + 1 (`dynamic_rope_update`), of all S positions. `rows`: only
    these rows of the tables (`posenc.models.row_blocks.table_rows`), bit for bit as in the whole tables.
    """
    if position_ids.ndim != 2 or position_ids.shape[0] != 3:
        raise ParameterError("position_ids", f"must have shape [3, S], got {list(position_ids.shape)}")
    if position_ids.size and int(position_ids.min()) < 0:
        raise ParameterError("position_ids", "must be >= 0")
    spec = rope_type_spec(params.rope_type)
    check_mrope_section(section, params.n_frequencies, order)
    seq_len = int(position_ids.max()) + 1 if position_ids.size else 1
    inv_freq = spec.inv_freq(params, seq_len).astype(F32)  # [d/2]
    attention_factor = float(spec.attention_factor(params))
    axis = mrope_axis(section, order, params.n_frequencies)  # [d/2]
    span = table_rows(rows, position_ids.shape[1])
    positions = position_ids[axis, span.start:span.stop].T.astype(np.float64)  # [rows, d/2]: each frequency's axis
    angles = positions * inv_freq.astype(np.float64)[None, :]  # [rows, d/2]
    out_dtype = np.dtype(dtype)
    cos = cast(np.cos(angles) * attention_factor, out_dtype)
    sin = cast(np.sin(angles) * attention_factor, out_dtype)
    if layout == "interleaved":
        return np.repeat(cos, 2, axis=1), np.repeat(sin, 2, axis=1), inv_freq, attention_factor
    return np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1), inv_freq, attention_factor
