"""2-D (axial) RoPE of vision encoders: Pixtral and Llama 4 vision.

References: transformers 5.23.0 `models/pixtral/modeling_pixtral.py` (`PixtralVisionRotaryEmbedding`,
positions from `PixtralVisionModel.forward`) and `models/llama4/modeling_llama4.py`
(`Llama4VisionRotaryEmbedding._compute_freqs_ci`, consumed by `vision_apply_rotary_emb`); docs/ENCODINGS.md §13.

Both split the head's frequencies between the patch row and column:
- Pixtral: inv_freq = theta^(−2k/head_dim) (float32), reordered to [even k | odd k]; a patch at (row h,
  column w) of an h × w grid (row-major) has angles [h · inv_freq[0::2] | w · inv_freq[1::2]]; cos/sin
  are cat(angles, angles) (rotate_half layout), [h·w, head_dim].
- Llama 4: f = theta^(−2k/(head_dim/2)), k < head_dim/4 (float32); patch i of the side × side grid has
  x = i mod side + 1, y = i div side + 1 and complex frequencies [x · f | y · f] (head_dim/2 of them,
  one per channel pair of `view_as_complex`: interleaved layout); the last row is the CLS token, zero
  angles. Rows: side² + 1.

Precision as RoPE (docs/ENCODINGS.md, precision contract): float32 frequencies, float64 angles and cos/sin,
cast once. Numpy only.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from posenc.models.dtypes import cast
from posenc.models.errors import ParameterError
from posenc.models.rope_types import default_inv_freq
from posenc.models.row_blocks import table_rows
from posenc.models.vision_towers import TOWERS_BY_NAME, tower_from_config

VisionRopeModel = Literal["pixtral", "llama4"]
VisionForm = Literal["full", "half"]
Tower = Literal["text", "vision"]

# config.json model_type → model; the config classes' defaults (PixtralVisionConfig, Llama4VisionConfig), kept
# with every other tower's in posenc.models.vision_towers
VISION_MODEL_TYPES: dict[str, VisionRopeModel] = {"pixtral": "pixtral", "llama4_vision_model": "llama4"}
VISION_DEFAULTS: dict[str, dict[str, int]] = {
    model: dict(TOWERS_BY_NAME[model].defaults) for model in ("pixtral", "llama4")}
DEFAULT_VISION_ROPE_THETA = TOWERS_BY_NAME["pixtral"].default_theta  # PixtralVisionConfig's and Llama4VisionConfig's


def check_vision_head_dim(head_dim: int) -> None:
    """Both models split head_dim/2 frequencies into two equal halves: head_dim must be a multiple of 4."""
    if head_dim < 4 or head_dim % 4:
        raise ParameterError("head_dim", f"must be a positive multiple of 4 (row and column halves), got {head_dim}")


def vision_frequencies(model: VisionRopeModel, head_dim: int, theta: float) -> np.ndarray:
    """The model's float32 frequencies → [head_dim/2]: Pixtral's `inv_freq_2d`; Llama 4's f twice (x | y)."""
    check_vision_head_dim(head_dim)
    if model == "pixtral":
        inv_freq = default_inv_freq(theta, head_dim)  # [head_dim/2]
        return np.concatenate([inv_freq[0::2], inv_freq[1::2]])
    half = head_dim // 2
    rope_freq = default_inv_freq(theta, half)[: half // 2]  # [head_dim/4]
    return np.concatenate([rope_freq, rope_freq])


def vision_positions(model: VisionRopeModel, height: int, width: int, rows: slice | None = None) -> np.ndarray:
    """Per patch, the position multiplying each half of the frequencies → int64 [rows, 2].

    Pixtral: (h, w) of an height × width grid, row-major. Llama 4 (height = width = side): (x, y) =
    (i mod side + 1, i div side + 1) for i < side², then the CLS row (0, 0). `rows`: only these rows
    (`posenc.models.row_blocks.table_rows`).
    """
    if height < 1 or width < 1:
        raise ParameterError("height" if height < 1 else "width", "must be >= 1")
    if model != "pixtral" and height != width:
        raise ParameterError("width", f"Llama 4's vision grid is square (image_size // patch_size), got "
                                      f"{height} x {width}")
    span = table_rows(rows, vision_rows(model, height, width))
    patch = np.arange(span.start, min(span.stop, height * width), dtype=np.int64)  # row-major patch index
    if model == "pixtral":
        return np.stack([patch // width, patch % width], axis=1)  # [rows, 2]: (h, w)
    grid = np.stack([patch % width + 1, patch // width + 1], axis=1)  # [rows, 2]: (x, y)
    cls = np.zeros((span.stop - span.start - len(patch), 2), dtype=np.int64)  # the CLS row when in range
    return np.concatenate([grid, cls])  # [rows, 2]


def vision_rows(model: VisionRopeModel, height: int, width: int) -> int:
    return height * width if model == "pixtral" else height * width + 1


def vision_layout(model: VisionRopeModel) -> str:
    """Channel order of form=full: what the model's rotation expects."""
    return "half" if model == "pixtral" else "interleaved"


def vision_cos_sin(
    model: VisionRopeModel, head_dim: int, theta: float, height: int, width: int,
    form: VisionForm = "full", dtype: npt.DTypeLike = np.float32, rows: slice | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """cos, sin and the float32 frequencies [head_dim/2].

    form="full": [rows, head_dim] in the model's layout (Pixtral: cat(a, a), the cos/sin its rotary module
    returns; Llama 4: each pair's value twice, as `view_as_complex` pairs channels). form="half":
    [rows, head_dim/2], one column per frequency (Llama 4: real and imaginary parts of `freqs_ci`).
    `rows`: only these rows (`posenc.models.row_blocks.table_rows`), bit for bit as in the whole table.
    """
    freqs = vision_frequencies(model, head_dim, theta)  # [head_dim/2]
    positions = vision_positions(model, height, width, rows).astype(np.float64)  # [rows, 2]
    quarter = head_dim // 4
    scale = np.repeat(positions, quarter, axis=1)  # [rows, head_dim/2]: row half, then column half
    angles = scale * freqs.astype(np.float64)[None, :]  # [rows, head_dim/2]
    out = np.dtype(dtype)
    cos, sin = cast(np.cos(angles), out), cast(np.sin(angles), out)
    if form == "full":
        if model == "pixtral":
            cos, sin = np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1)  # [rows, head_dim]
        else:
            cos, sin = np.repeat(cos, 2, axis=1), np.repeat(sin, 2, axis=1)  # [rows, head_dim]
    return cos, sin, freqs


@dataclass(frozen=True)
class VisionRopeConfig:
    """What a vision config.json says about its RoPE; `section` is "" or "vision_config"."""

    model: VisionRopeModel
    head_dim: int
    rope_theta: float
    image_size: int
    patch_size: int
    section: str


def vision_rope_from_config(config: Mapping[str, Any], tower: Tower | None) -> VisionRopeConfig | None:
    """The vision RoPE of a Pixtral or Llama 4 config.json, or None when the text model's RoPE is meant.

    A bare vision config (model_type pixtral / llama4_vision_model) is read unless tower="text"; a wrapper
    (LLaVA-Pixtral, Mistral-3, Llama 4) only with tower="vision", from its `vision_config`
    (`posenc.models.vision_towers.tower_from_config` reads both). head_dim is hidden_size // num_attention_heads
    (PixtralVisionConfig sets it so whatever the file says).
    """
    if tower == "text":
        return None
    found = tower_from_config(config, tower == "vision")
    if found is None or found.scheme.model_types[0] not in VISION_MODEL_TYPES:
        if tower is None:
            return None
        raise ParameterError("tower", "tower=vision needs a vision config or a `vision_config` of model_type "
                                      + " or ".join(VISION_MODEL_TYPES))
    check_vision_head_dim(found.head_dim)
    return VisionRopeConfig(VISION_MODEL_TYPES[found.scheme.model_types[0]], found.head_dim, found.rope_theta,
                            found.image_size, found.patch_size, found.section)
