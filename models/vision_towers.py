"""Per-patch rotary tables of vision towers, from their config: the cos and sin each tower passes to its rotary
application in attention, rows in the order its attention sees them (docs/ENCODINGS.md §13.1).

Reference: the vision towers of transformers 5.25.0 (`tests/parity/vision_sweep.py` runs each and compares).
Every tower builds its table the same way, and differs only in the facts `TowerScheme` holds, one home each:

1. float32 frequencies: `axial` (`1 / theta^(arange(0, d, 2) / d)`, d = head_dim / 2, shared by every axis),
   `axial3` (d = 2 · ((head_dim // 3) // 2), MiniMax-M3-VL's t, h, w bands: rotary width 3d < head_dim),
   or `pixtral` (d = head_dim, the row axis taking the even frequencies, the column axis the odd ones);
2. positions of every patch: raster per frame, or in spatial-merge blocks (`merge` × `merge` patches
   consecutive, `transformers.vision_utils.get_vision_position_ids`), then, for window attention, the merged
   units reordered window by window (`get_vision_window_index`); `offset` added (1: Muse, inkling2, Llama 4);
   SAM 3's ViT scales them by `window_size / width` in float32;
3. CLS rows: first or last, per frame or per image, with zero angles or a learned angle vector (a checkpoint
   weight: left out of the table, the metadata says where it goes);
4. columns: per axis, the axis's frequencies times its position, the axes `blocked` (all of one axis, then the
   next) or `per_frequency` (Kimi-K2.5: the axes alternate within each frequency);
5. pair layout: `half` (cat(a, a): rotate_half), `interleaved` (each angle twice: pairs (2k, 2k+1)) or
   `half_per_axis` (Gemma 4: the head split by axis, each part cat(a, a));
6. video: the frame's table repeated per frame (`repeat`), a temporal position axis (`temporal`), or images only.

Precision as RoPE (docs/ENCODINGS.md, precision contract): float32 frequencies, float64 angles and cos/sin,
cast once. Numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from posenc.models.bounds import MAX_DIM, MAX_GRID, MAX_MERGE, MAX_THETA
from posenc.models.dtypes import cast
from posenc.models.errors import ParameterError
from posenc.models.rope_types import DEFAULT_ROPE_TYPE, default_inv_freq
from posenc.models.row_blocks import table_rows

Axis = Literal["t", "h", "w"]
AXIS_INDEX: dict[str, int] = {"t": 0, "h": 1, "w": 2}
Frequencies = Literal["axial", "axial3", "pixtral"]
Columns = Literal["blocked", "per_frequency"]
Pairs = Literal["half", "interleaved", "half_per_axis"]
Video = Literal["repeat", "temporal", "images"]
HeadDim = Literal["heads", "embed_dim", "memory_attention"]
Merge = Literal["config", "one", "input"]
Window = Literal["", "window_size", "pos_emb_height"]
Grid = Literal["input", "side", "feat_sizes", "window"]
TowerForm = Literal["full", "half"]


@dataclass(frozen=True)
class Cls:
    """A CLS row: `first` or `last`, once per `frame` or per `image` (a grid), angles `zero` or `learned`."""

    where: Literal["first", "last"]
    per: Literal["frame", "image"]
    angles: Literal["zero", "learned"]


@dataclass(frozen=True)
class TowerScheme:
    """What one vision tower does, as data (the module docstring's six facts, and where its config keeps them).

    `model_types`: the vision config's model_type(s); `wrappers`: (model_type of a whole config.json, dotted path
    of the vision config in it), also used when the vision config has no model_type of its own. `defaults`: the
    config class's defaults of the keys read (a config.json may leave them out); `aliases`: the config class's
    attribute_map for them (a config.json may use either name). `learned_cls`: the vision model's weight holding a
    learned CLS angle vector.
    """

    name: str
    title: str
    module: str  # the rotary module's class in transformers, for the docs and the sweep
    model_types: tuple[str, ...]
    wrappers: tuple[tuple[str, str], ...]
    defaults: Mapping[str, Any]
    default_theta: float = 10000.0
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    head_dim: HeadDim = "heads"
    head_dim_key: bool = True  # a `head_dim` in the config wins (getattr(config, "head_dim", None) or ...)
    rope_types: tuple[str, ...] = ("axial",)
    frequencies: Frequencies = "axial"
    axes: tuple[Axis, ...] = ("h", "w")
    columns: Columns = "blocked"
    pairs: Pairs = "half"
    merge: Merge = "config"
    window: Window = ""
    offset: int = 0
    cls: Cls | None = None
    learned_cls: str = ""
    video: Video = "repeat"
    grid: Grid = "input"
    max_grid: str = ""  # "side": h, w at most image_size // patch_size (Pixtral's precomputed table)
    position_scale: bool = False  # SAM 3 ViT: positions times window_size / width, in float32
    note: str = ""


_QWEN_HEADS = {"num_heads": ("num_attention_heads",)}
_Q = {"hidden_size": 1152, "num_heads": 16, "spatial_merge_size": 2}  # Qwen3-VL's vision defaults
_GLM = {"hidden_size": 1536, "num_heads": 12, "spatial_merge_size": 2}
_WINDOW = {"hidden_size": 3584, "num_heads": 16, "spatial_merge_size": 2, "window_size": 112, "patch_size": 14}
_SAM = {"memory_attention_hidden_size": 256, "memory_attention_downsample_rate": 1,
        "memory_attention_num_attention_heads": 1}


def _vc(wrapper: str) -> tuple[tuple[str, str], ...]:
    """A whole config of model_type `wrapper` with the vision config at `vision_config`."""
    return ((wrapper, "vision_config"),)


def _qwen(name: str, title: str, module: str, vision: str, wrapper: str, path: str = "vision_config",
          defaults: Mapping[str, Any] = _Q, **facts: Any) -> TowerScheme:
    """A tower of the Qwen2-VL line: spatial-merge block order, rotate_half, frames repeated."""
    return TowerScheme(name, title, module, (vision,), ((wrapper, path),), defaults, aliases=_QWEN_HEADS, **facts)


TOWERS: tuple[TowerScheme, ...] = (
    _qwen("qwen2_vl", "Qwen2-VL", "Qwen2VLVisionRotaryEmbedding", "qwen2_vl_vision", "qwen2_vl",
          defaults={"embed_dim": 1280, "num_heads": 16, "spatial_merge_size": 2}, head_dim="embed_dim"),
    _qwen("qwen2_5_vl", "Qwen2.5-VL", "Qwen2_5_VLVisionRotaryEmbedding", "qwen2_5_vl_vision", "qwen2_5_vl",
          defaults=_WINDOW, window="window_size"),
    TowerScheme("qwen2_5_omni", "Qwen2.5-Omni", "Qwen2_5OmniVisionRotaryEmbedding", ("qwen2_5_omni_vision_encoder",),
                (("qwen2_5_omni", "thinker_config.vision_config"), ("qwen2_5_omni_thinker", "vision_config")),
                _WINDOW, aliases=_QWEN_HEADS, window="window_size"),
    _qwen("qwen3_vl", "Qwen3-VL", "Qwen3VLVisionRotaryEmbedding", "qwen3_vl_vision", "qwen3_vl"),
    _qwen("qwen3_vl_moe", "Qwen3-VL-MoE", "Qwen3VLMoeVisionRotaryEmbedding", "qwen3_vl_moe_vision", "qwen3_vl_moe"),
    _qwen("qwen3_5", "Qwen3.5", "Qwen3_5VisionRotaryEmbedding", "qwen3_5_vision", "qwen3_5"),
    _qwen("qwen3_5_moe", "Qwen3.5-MoE", "Qwen3_5MoeVisionRotaryEmbedding", "qwen3_5_moe_vision", "qwen3_5_moe"),
    TowerScheme("qwen3_omni_moe", "Qwen3-Omni", "Qwen3OmniMoeVisionRotaryEmbedding",
                ("qwen3_omni_moe_vision_encoder",),
                (("qwen3_omni_moe", "thinker_config.vision_config"), ("qwen3_omni_moe_thinker", "vision_config")),
                _Q, aliases=_QWEN_HEADS),
    _qwen("qwen4_exp", "Qwen4-Exp", "Qwen4ExpVisionRotaryEmbedding", "qwen4_exp_vision", "qwen4_exp"),
    _qwen("glm4v", "GLM-4.1V", "Glm4vVisionRotaryEmbedding", "glm4v_vision", "glm4v", defaults=_GLM),
    _qwen("glm4v_moe", "GLM-4.5V", "Glm4vMoeVisionRotaryEmbedding", "glm4v_moe_vision", "glm4v_moe", defaults=_GLM),
    _qwen("glm_ocr", "GLM-OCR", "GlmOcrVisionRotaryEmbedding", "glm_ocr_vision", "glm_ocr",
          defaults={"hidden_size": 1024, "num_heads": 16, "spatial_merge_size": 2}),
    _qwen("glm5_next", "GLM-5-Next", "Glm5NextVisionRotaryEmbedding", "glm5_next_vision", "glm5_next",
          defaults={"hidden_size": 1024, "num_heads": 16, "spatial_merge_size": 2}),
    _qwen("ernie4_5_vl_moe", "ERNIE-4.5-VL", "Ernie4_5_VLMoeVisionRotaryEmbedding", "ernie4_5_vl_moe_vision",
          "ernie4_5_vl_moe", defaults={"hidden_size": 1280, "num_heads": 16, "spatial_merge_size": 2}),
    _qwen("cohere_compass", "Cohere Compass", "CohereCompassVisionRotaryEmbedding", "cohere_compass_vision",
          "cohere_compass"),
    _qwen("exaone4_5", "EXAONE 4.5", "Exaone4_5_VisionRotaryEmbedding", "exaone4_5_vision", "exaone4_5",
          defaults=_WINDOW, window="window_size"),
    TowerScheme("dots3_note", "dots3", "Dots3NoteVisionRotaryEmbedding", ("dots3_note_vision_encoder",),
                _vc("dots3_note"),
                {"hidden_size": 1536, "num_attention_heads": 24, "spatial_merge_size": 2}),
    TowerScheme("ovis2_5", "Ovis2.5", "Ovis2_5VisionRotaryEmbedding", ("ovis2_5_vision",), _vc("ovis2_5"),
                {"hidden_size": 1152, "num_attention_heads": 16, "spatial_merge_size": 2, "window_size": 112,
                 "patch_size": 16}, window="window_size"),
    TowerScheme("llava_onevision1_5", "LLaVA-OneVision-1.5", "LlavaOnevision15VisionRotaryEmbedding",
                ("llava_onevision1_5_vision",), _vc("llava_onevision1_5"),
                {"hidden_size": 1024, "num_heads": 16, "spatial_merge_size": 2}, aliases=_QWEN_HEADS,
                cls=Cls("first", "frame", "learned"), learned_cls="cls_embeddings.class_pos_emb"),
    TowerScheme("lfm3_vl", "LFM3-VL", "Lfm3VlVisionRotaryEmbedding", ("lfm3_vl_vision",), _vc("lfm3_vl"),
                {"hidden_size": 1024, "num_attention_heads": 16, "spatial_merge_size": 2}, default_theta=1e6),
    TowerScheme("minimax_m3_vl", "MiniMax-M3-VL", "MiniMaxM3VLVisionRotaryEmbedding", ("minimax_m3_vl_vision",),
                _vc("minimax_m3_vl"),
                {"hidden_size": 1280, "num_attention_heads": 16, "spatial_merge_size": 2},
                frequencies="axial3", axes=("t", "h", "w"), video="temporal"),
    TowerScheme("inkling2", "inkling2", "Inkling2VisionRotaryEmbedding", ("inkling2_vision",), _vc("inkling2"),
                {"hidden_size": 1024, "num_attention_heads": 16, "spatial_merge_size": 2},
                aliases={"spatial_merge_size": ("adapter_merge_size",)}, axes=("w", "h"), pairs="interleaved",
                offset=1, cls=Cls("first", "image", "zero")),
    TowerScheme("kimi_k25", "Kimi-K2.5", "Kimi_K25VisionRotaryEmbedding", ("kimi_k25_vision",), _vc("kimi_k25"),
                {"hidden_size": 1152, "num_attention_heads": 16}, merge="one", axes=("w", "h"),
                columns="per_frequency"),
    TowerScheme("paddleocr_vl", "PaddleOCR-VL", "PaddleOCRVisionRotaryEmbedding", ("paddleocr_vl_vision",),
                _vc("paddleocr_vl"), {"hidden_size": 1152, "num_attention_heads": 16}, merge="one"),
    TowerScheme("video_llama_3", "VideoLLaMA3", "VideoLlama3VisionRotaryEmbedding", ("video_llama_3_vision",),
                _vc("video_llama_3"), {"hidden_size": 768, "num_attention_heads": 12}, merge="input",
                note="the merge size is the tower's input (image_merge_sizes 1, video_merge_sizes 2 from the "
                     "processors): `merge_size`, default 1"),
    TowerScheme("muse_spark", "Muse Spark", "MuseSparkVisionRotaryEmbedding", ("muse_spark_vision",),
                _vc("muse_spark"), {"hidden_size": 1536, "num_attention_heads": 16, "pos_emb_height": 32},
                merge="one", window="pos_emb_height", axes=("w", "h"), offset=1),
    TowerScheme("muse_glimmer", "Muse Glimmer", "MuseGlimmerVisionRotaryEmbedding", ("muse_glimmer_vision",),
                _vc("muse_glimmer"),
                {"hidden_size": 1536, "num_attention_heads": 16, "pos_emb_height": 32},
                merge="one", window="pos_emb_height", axes=("w", "h"), offset=1),
    TowerScheme("mlcd", "MLCD", "MLCDRotaryEmbedding", ("mlcd_vision_model",), (),
                {"hidden_size": 1664, "num_attention_heads": 16}, merge="one",
                cls=Cls("first", "image", "learned"), learned_cls="class_pos_emb", video="images"),
    TowerScheme("step3p7", "Step3p7", "Step3p7VisionRotaryEmbedding", ("step3p5_vision",), _vc("step3p7"),
                {"hidden_size": 1536, "num_attention_heads": 16}, merge="one", axes=("w", "h"), video="images"),
    TowerScheme("gemma4", "Gemma 4", "Gemma4VisionRotaryEmbedding", ("gemma4_vision",), _vc("gemma4"),
                {"head_dim": 64, "hidden_size": 768, "num_attention_heads": 12}, default_theta=100.0, merge="one",
                axes=("w", "h"), pairs="half_per_axis", video="images",
                note="padding patches (position -1, -1) left out"),
    TowerScheme("pixtral", "Pixtral", "PixtralVisionRotaryEmbedding", ("pixtral",),
                (("llava", "vision_config"), ("mistral3", "vision_config")),
                {"hidden_size": 1024, "num_attention_heads": 16, "image_size": 1024, "patch_size": 16},
                head_dim_key=False, frequencies="pixtral", merge="one", video="images", max_grid="side"),
    TowerScheme("llama4", "Llama 4", "Llama4VisionRotaryEmbedding", ("llama4_vision_model",), _vc("llama4"),
                {"hidden_size": 768, "num_attention_heads": 16, "image_size": 448, "patch_size": 14},
                head_dim_key=False, rope_types=(DEFAULT_ROPE_TYPE, "axial"), merge="one", axes=("w", "h"),
                pairs="interleaved",
                offset=1, cls=Cls("last", "image", "zero"), video="images", grid="side"),
    TowerScheme("sam2_video", "SAM 2 video (memory attention)", "Sam2VideoVisionRotaryEmbedding", ("sam2_video",), (),
                {**_SAM, "memory_attention_rope_feat_sizes": [64, 64]}, head_dim="memory_attention", merge="one",
                axes=("w", "h"), pairs="interleaved", video="images", grid="feat_sizes",
                note="keys: the table repeated per memory frame, object-pointer keys not rotated"),
    TowerScheme("sam3_tracker_video", "SAM 3 tracker video (memory attention)", "Sam3TrackerVideoVisionRotaryEmbedding",
                ("sam3_tracker_video",), (), {**_SAM, "memory_attention_rope_feat_sizes": [72, 72]},
                head_dim="memory_attention", merge="one", axes=("w", "h"), pairs="interleaved", video="images",
                grid="feat_sizes", note="keys: the table repeated per memory frame, object-pointer keys not rotated"),
    TowerScheme("edgetam_video", "EdgeTAM video (memory attention)", "EdgeTamVideoVisionRotaryEmbedding",
                ("edgetam_video",), (), {**_SAM, "memory_attention_rope_feat_sizes": [64, 64]},
                head_dim="memory_attention", merge="one", axes=("w", "h"), pairs="interleaved", video="images",
                grid="feat_sizes", note="the keys' table: grid_thw=1,k,k with memory_attention_rope_k_sizes"),
    TowerScheme("sam3_vit", "SAM 3 ViT", "Sam3ViTRotaryEmbedding", ("sam3_vit_model",),
                (("sam3", "vision_config.backbone_config"), ("sam3_vision_model", "backbone_config")),
                {"hidden_size": 1024, "num_attention_heads": 16, "window_size": 24}, merge="one", axes=("w", "h"),
                pairs="interleaved", video="images", grid="window", position_scale=True,
                note="the grid's table: window layers window_size², global layers (image_size // patch_size)²"),
)
TOWERS_BY_NAME: dict[str, TowerScheme] = {scheme.name: scheme for scheme in TOWERS}


# --- configuration ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VisionTower:
    """A tower's table parameters, resolved from its config (`tower_from_config`)."""

    scheme: TowerScheme
    head_dim: int
    rope_theta: float
    merge: int  # spatial merge of the row order (1: raster); "input" towers: the default, 1
    window: int  # window side in merged units (0: no window reordering)
    default_grid: tuple[int, int] | None  # (h, w) the tower's table has when the request names none
    max_side: int | None  # h and w at most this (Pixtral)
    window_size: int  # SAM 3 ViT: the position scale's numerator
    section: str  # where the vision config sits in the upload ("" : the upload itself)
    image_size: int = 0  # Pixtral, Llama 4: the grid side is image_size // patch_size
    patch_size: int = 0


def _value(cfg: Mapping[str, Any], scheme: TowerScheme, key: str) -> Any:
    for name in (key, *scheme.aliases.get(key, ())):
        if cfg.get(name) is not None:
            return cfg[name]
    return scheme.defaults.get(key)


def _int(cfg: Mapping[str, Any], scheme: TowerScheme, key: str, upper: int = MAX_DIM * 256) -> int:
    value = _value(cfg, scheme, key)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= upper:
        raise ParameterError(key, f"must be an integer in [1, {upper}] in the vision config, got {value!r}")
    return value


def _pair(cfg: Mapping[str, Any], scheme: TowerScheme, key: str) -> tuple[int, int]:
    value = _value(cfg, scheme, key)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value, value]
    if (not isinstance(value, list | tuple) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_GRID for v in value)):
        raise ParameterError(key, f"must be two integers in [1, {MAX_GRID}] in the vision config, got {value!r}")
    return value[0], value[1]


def tower_head_dim(cfg: Mapping[str, Any], scheme: TowerScheme) -> int:
    """The head size the tower's rotary module reads from its config."""
    if scheme.head_dim == "memory_attention":
        hidden = _int(cfg, scheme, "memory_attention_hidden_size")
        split = _int(cfg, scheme, "memory_attention_downsample_rate") * _int(
            cfg, scheme, "memory_attention_num_attention_heads")
        return hidden // split
    head_dim = _value(cfg, scheme, "head_dim") if scheme.head_dim_key else None
    if head_dim:  # `getattr(config, "head_dim", None) or ...`: a 0 falls through as in the module
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not 1 <= head_dim <= MAX_DIM:
            raise ParameterError("head_dim", f"must be an integer in [1, {MAX_DIM}], got {head_dim!r}")
        return head_dim
    hidden_key = "embed_dim" if scheme.head_dim == "embed_dim" else "hidden_size"
    heads_key = "num_heads" if "num_heads" in scheme.defaults else "num_attention_heads"
    return _int(cfg, scheme, hidden_key) // _int(cfg, scheme, heads_key)


def tower_theta(cfg: Mapping[str, Any], scheme: TowerScheme) -> float:
    """rope_parameters' (or rope_scaling's) rope_theta, else the config's rope_theta, else the class default;
    a rope_type the tower's module refuses is refused."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise ParameterError("rope_parameters", f"must be an object, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", scheme.rope_types[0]))
    if rope_type not in scheme.rope_types:
        raise ParameterError("rope_type", f"{scheme.title}'s vision rotary module supports only "
                                          f"{' or '.join(scheme.rope_types)}, got {rope_type!r}")
    theta = rope.get("rope_theta")
    theta = cfg.get("rope_theta", scheme.default_theta) if theta is None else theta
    if isinstance(theta, bool) or not isinstance(theta, int | float) or not 1 < theta <= MAX_THETA:
        raise ParameterError("rope_theta", f"must be a number in (1, {MAX_THETA:g}], got {theta!r}")
    return float(theta)


def _section(config: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    node: Any = config
    for key in path.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else None


def find_tower(config: Mapping[str, Any], vision: bool) -> tuple[TowerScheme, Mapping[str, Any], str] | None:
    """(scheme, vision config, its dotted path) of a config.json: a bare vision config by its model_type; with
    `vision` (tower=vision), also a whole config by the vision config's model_type, or by the whole config's
    model_type where the vision config has none. None: no vision tower this module knows."""
    model_type = config.get("model_type")
    for scheme in TOWERS:
        if model_type in scheme.model_types:
            return scheme, config, ""
    if not vision:
        return None
    for path in dict.fromkeys(path for scheme in TOWERS for _, path in scheme.wrappers):  # any wrapper's place
        section = _section(config, path)
        if section is None:
            continue
        for scheme in TOWERS:
            if section.get("model_type") in scheme.model_types:
                return scheme, section, path
    for scheme in TOWERS:
        for wrapper, path in scheme.wrappers:
            section = _section(config, path)
            if section is not None and section.get("model_type") is None and model_type == wrapper:
                return scheme, section, path
    return None


def tower_from_config(config: Mapping[str, Any], vision: bool) -> VisionTower | None:
    """The tower table's parameters from a config.json (`find_tower`), validated; None: no known tower."""
    found = find_tower(config, vision)
    if found is None:
        return None
    scheme, cfg, section = found
    head_dim = tower_head_dim(cfg, scheme)
    check_tower_head_dim(scheme, head_dim)
    theta = tower_theta(cfg, scheme)
    merge = _int(cfg, scheme, "spatial_merge_size", MAX_MERGE) if scheme.merge == "config" else 1
    window = 0
    if scheme.window == "window_size":
        window = _int(cfg, scheme, "window_size") // merge // _int(cfg, scheme, "patch_size")
        if window < 1:
            raise ParameterError("window_size", "must be at least spatial_merge_size · patch_size (a window of at "
                                                "least one merged patch)")
    elif scheme.window == "pos_emb_height":
        window = _int(cfg, scheme, "pos_emb_height", MAX_GRID)
    default_grid, max_side, window_size, image_size, patch_size = None, None, 0, 0, 0
    if scheme.grid == "side" or scheme.max_grid == "side":
        image_size, patch_size = _int(cfg, scheme, "image_size"), _int(cfg, scheme, "patch_size")
        side = image_size // patch_size
        if side < 1:
            raise ParameterError("patch_size", "must not exceed image_size")
        max_side = side
        default_grid = (side, side) if scheme.grid == "side" else None
    elif scheme.grid == "feat_sizes":
        width, height = _pair(cfg, scheme, "memory_attention_rope_feat_sizes")  # meshgrid(arange([1]), arange([0]))
        default_grid = (height, width)
    elif scheme.grid == "window":
        window_size = _int(cfg, scheme, "window_size", MAX_GRID)
        default_grid = (window_size, window_size)
    return VisionTower(scheme, head_dim, theta, merge, window, default_grid, max_side, window_size, section,
                       image_size, patch_size)


# --- the table ----------------------------------------------------------------------------------------


def check_tower_head_dim(scheme: TowerScheme, head_dim: int) -> None:
    """Every axis needs a frequency, and the rotated width must fit the head: two axes of head_dim / 4 frequencies
    each need a multiple of 4 (MiniMax-M3-VL's three bands of (head_dim // 3) // 2 fit any head of at least 6)."""
    if scheme.frequencies == "axial3":
        if head_dim < 6:
            raise ParameterError("head_dim", f"{scheme.title}: the vision head size must be at least 6, got {head_dim}")
    elif head_dim < 4 or head_dim % 4:
        raise ParameterError("head_dim", f"{scheme.title}: the vision head size must be a positive multiple of 4 "
                                         f"(two axes of head_dim / 4 frequencies), got {head_dim}")


def tower_frequencies(scheme: TowerScheme, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(axis index into (t, h, w) int [n], float32 frequency [n]) of the n angle columns, in column order."""
    if scheme.frequencies == "pixtral":
        full = default_inv_freq(theta, head_dim)  # [head_dim/2]: the row axis the even ones, the column the odd
        per_axis = [full[0::2], full[1::2]]
    else:
        spatial = head_dim // 2 if scheme.frequencies == "axial" else 2 * ((head_dim // 3) // 2)
        per_axis = [default_inv_freq(theta, spatial)] * len(scheme.axes)
    axes = [np.full(f.size, AXIS_INDEX[a]) for a, f in zip(scheme.axes, per_axis, strict=True)]
    if scheme.columns == "per_frequency":
        return np.stack(axes, axis=1).reshape(-1), np.stack(per_axis, axis=1).reshape(-1)
    return np.concatenate(axes), np.concatenate(per_axis)


def check_grid(tower: VisionTower, grid: tuple[int, int, int], merge: int) -> None:
    t, h, w = grid
    scheme = tower.scheme
    if scheme.video == "images" and t != 1:
        raise ParameterError("grid_thw", f"{scheme.title} encodes images (or frames) one at a time: t must be 1, "
                                         f"got {t} (request one frame's table)")
    if scheme.grid == "side" and tower.default_grid is not None and (h, w) != tower.default_grid:
        side_h, side_w = tower.default_grid
        raise ParameterError("grid_thw", f"{scheme.title}'s grid is fixed at image_size // patch_size: "
                                         f"1,{side_h},{side_w}, got {t},{h},{w}")
    if tower.max_side is not None and max(h, w) > tower.max_side:
        raise ParameterError("grid_thw", f"{scheme.title}: at most image_size // patch_size = {tower.max_side} "
                                         f"patches per side, got {h} x {w}")
    if h % merge or w % merge:
        raise ParameterError("grid_thw", f"h and w must be multiples of the spatial merge size {merge}, got {h} x {w}")


def _frame_positions(h: int, w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of one frame's patches, int64 [h·w] each, in merge × merge blocks (merge 1: raster)."""
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // merge, merge, w // merge, merge)
    return rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1), cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)


def window_order(t: int, h: int, w: int, merge: int, window: int) -> np.ndarray:
    """The merged units (t · h/merge · w/merge, frame-major) in window order: `get_vision_window_index`."""
    lh, lw = h // merge, w // merge
    pad_h, pad_w = window - lh % window, window - lw % window  # as the reference: a whole window when divisible
    padded = np.full((t, lh + pad_h, lw + pad_w), -1, dtype=np.int64)
    padded[:, :lh, :lw] = np.arange(t * lh * lw).reshape(t, lh, lw)
    nh, nw = (lh + pad_h) // window, (lw + pad_w) // window
    flat = padded.reshape(t, nh, window, nw, window).transpose(0, 1, 3, 2, 4).reshape(-1)
    return flat[flat >= 0]


def tower_rows(tower: VisionTower, grid: tuple[int, int, int], merge: int) -> int:
    """Rows of the table: the patches, plus the CLS rows the table holds (zero-angle ones)."""
    t, h, w = grid
    cls = tower.scheme.cls
    extra = 0 if cls is None or cls.angles == "learned" else (t if cls.per == "frame" else 1)
    return t * h * w + extra


def tower_positions(tower: VisionTower, grid: tuple[int, int, int], merge: int) -> np.ndarray:
    """float64 [rows, 3]: the (t, h, w) position multiplying each axis's frequencies, per row in attention order
    (CLS rows zero; positions offset and scaled as the tower does)."""
    scheme = tower.scheme
    t, h, w = grid
    rows, cols = _frame_positions(h, w, merge)
    patches = np.stack([np.repeat(np.arange(t), h * w), np.tile(rows, t), np.tile(cols, t)], axis=1)  # [t·h·w, 3]
    if tower.window:
        unit = merge * merge
        order = window_order(t, h, w, merge, tower.window)
        patches = patches.reshape(-1, unit, 3)[order].reshape(-1, 3)
    out = patches.astype(np.float64)
    if scheme.video != "temporal":
        out[:, 0] = 0.0
    out[:, 1:] += scheme.offset
    if scheme.position_scale:  # fp32 positions times window_size / width, in float32 (Sam3ViTLayer)
        scale = np.float32(tower.window_size / w)
        out[:, 1:] = (out[:, 1:].astype(np.float32) * scale).astype(np.float64)
    cls = scheme.cls
    if cls is None or cls.angles == "learned":
        return out
    zero = np.zeros((1, 3))
    if cls.per == "image":
        return np.concatenate([zero, out] if cls.where == "first" else [out, zero])
    frames = np.split(out, t)
    return np.concatenate([part for f in frames for part in ([zero, f] if cls.where == "first" else [f, zero])])


def tower_cos_sin(tower: VisionTower, grid: tuple[int, int, int], merge: int | None = None, form: TowerForm = "full",
                  dtype: npt.DTypeLike = np.float32, rows: slice | None = None, positions: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cos, sin [rows, width] and the float32 frequency of each angle column [n].

    form="full": what the tower passes to its rotary application, width = 2n (the pair layout applied);
    form="half": one column per angle, width n. `rows`: only these rows (`posenc.models.row_blocks.table_rows`),
    bit for bit as in the whole table. `merge`: the spatial merge of "input" towers (VideoLLaMA3), else the config's.
    `positions`: `tower_positions` of the whole table when the caller keeps it (computed here otherwise).
    """
    merge = tower.merge if merge is None else merge
    check_grid(tower, grid, merge)
    axis, freqs = tower_frequencies(tower.scheme, tower.head_dim, tower.rope_theta)
    span = table_rows(rows, tower_rows(tower, grid, merge))
    if positions is None:
        positions = tower_positions(tower, grid, merge)
    positions = positions[span.start:span.stop]
    angles = positions[:, axis] * freqs.astype(np.float64)[None, :]  # [rows, n]
    out = np.dtype(dtype)
    cos, sin = cast(np.cos(angles), out), cast(np.sin(angles), out)
    if form == "full":
        cos, sin = spread(tower.scheme, cos), spread(tower.scheme, sin)
    return cos, sin, freqs


def spread(scheme: TowerScheme, table: np.ndarray) -> np.ndarray:
    """One column per angle → the tower's pair layout (width 2n)."""
    if scheme.pairs == "interleaved":
        return np.repeat(table, 2, axis=1)
    if scheme.pairs == "half":
        return np.concatenate([table, table], axis=1)
    parts = np.split(table, len(scheme.axes), axis=1)  # half_per_axis: each axis's part rotate_half on its own
    return np.concatenate([block for part in parts for block in (part, part)], axis=1)


def tower_width(tower: VisionTower, form: TowerForm) -> int:
    n = tower_frequencies(tower.scheme, tower.head_dim, tower.rope_theta)[1].size
    return 2 * n if form == "full" else n


def describe(tower: VisionTower, merge: int) -> dict[str, str]:
    """The metadata of a tower table: what each row and column is."""
    scheme = tower.scheme
    order = ("raster" if merge == 1 else f"spatial-merge blocks of {merge} x {merge}")
    if tower.window:
        order += f", merged units reordered window by window ({tower.window} x {tower.window} per window)"
    cls = scheme.cls
    cls_text = "none" if cls is None else (
        f"{cls.where} per {cls.per}, " + ("zero angles" if cls.angles == "zero" else
                                          f"learned angles ({scheme.learned_cls}): not in the table, insert "
                                          f"cos/sin(cat(a, a)) of that weight {cls.where} per {cls.per}"))
    axes = (", then ".join(f"{a} frequencies" for a in scheme.axes) if scheme.columns == "blocked" else
            "per frequency k: " + ", ".join(f"{a}*f_k" for a in scheme.axes))
    video = {"repeat": "each frame's table repeated per frame", "temporal": "temporal axis: t position = frame index",
             "images": "images only (t = 1)"}[scheme.video]
    return {"rows": order + (f"; positions + {scheme.offset}" if scheme.offset else ""),
            "cls_rows": cls_text, "columns": axes, "layout": scheme.pairs, "video": video,
            "head_dim": str(tower.head_dim), "rope_theta": repr(tower.rope_theta)}
