"""The vision towers' schemes: each tower's facts (`TowerScheme`: where its config lives, its frequencies,
positions, CLS rows, columns, pair layout and video rule), one home each, in one table (`TOWERS`); the table
math that reads them is `posenc.models.vision_towers` (its docstring says what each fact means)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from posenc.models.rope_types import DEFAULT_ROPE_TYPE

Axis = Literal["t", "h", "w"]
AXIS_INDEX: dict[str, int] = {"t": 0, "h": 1, "w": 2}
Frequencies = Literal["axial", "axial3", "pixtral", "sequence"]
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
    learned CLS angle vector. `queries`: learned query tokens after the feature tokens (`sequence` towers): the
    first count at least the tokens, else the last.
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
    queries: tuple[int, ...] = ()
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
    TowerScheme("deepseek_ocr2", "DeepSeek-OCR-2", "DeepseekOcr2VisionRotaryEmbedding", ("deepseek_ocr2_encoder",),
                (("deepseek_ocr2", "vision_config.encoder_config"), ("deepseek_ocr2_vision", "encoder_config")),
                {"hidden_size": 4096, "num_attention_heads": 32}, rope_types=(DEFAULT_ROPE_TYPE,),
                frequencies="sequence", axes=("t",), merge="one", video="images", queries=(144, 256),
                note="grid_thw=1,h,w: the SAM feature grid (h·w tokens); the encoder's 1-D positions run over the "
                     "tokens, then the learned queries"),
)
TOWERS_BY_NAME: dict[str, TowerScheme] = {scheme.name: scheme for scheme in TOWERS}
