"""Per-patch rotary tables of vision towers, from their config: the cos and sin each tower passes to its rotary
application in attention, rows in the order its attention sees them (docs/ENCODINGS.md §13.1).

Reference: the vision towers of transformers 5.25.0 (`tests/parity/vision_sweep.py` runs each and compares).
Every tower builds its table the same way, and differs only in the facts `TowerScheme` holds, one home each:

1. float32 frequencies: `axial` (`1 / theta^(arange(0, d, 2) / d)`, d = head_dim / 2, shared by every axis),
   `axial3` (d = 2 · ((head_dim // 3) // 2), MiniMax-M3-VL's t, h, w bands: rotary width 3d < head_dim),
   `pixtral` (d = head_dim, the row axis taking the even frequencies, the column axis the odd ones), or
   `sequence` (d = head_dim, one axis: DeepSeek-OCR-2's 1-D rotary over its feature tokens then learned queries);
2. positions of every patch: raster per frame, or in spatial-merge blocks (`merge` × `merge` patches
   consecutive, `transformers.vision_utils.get_vision_position_ids`), then, for window attention, the merged
   units reordered window by window (`get_vision_window_index`); `offset` added (1: Muse, inkling2, Llama 4);
   SAM 3's ViT scales them by `window_size / width` in float32;
3. CLS rows: first or last, per frame or per image, with zero angles or a learned angle vector (a checkpoint
   weight no config holds: in the table when the request gives its values, else left out and the metadata
   says so);
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
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from posenc.models.bounds import MAX_DIM, MAX_GRID, MAX_MERGE, MAX_THETA
from posenc.models.dtypes import cast
from posenc.models.errors import ParameterError
from posenc.models.rope_types import DEFAULT_ROPE_TYPE, default_inv_freq
from posenc.models.row_blocks import table_rows
from posenc.models.vision_tower_schemes import AXIS_INDEX, TowerForm
from posenc.models.vision_tower_schemes import TOWERS as TOWERS  # the table's readers import it from here
from posenc.models.vision_tower_schemes import TOWERS_BY_NAME as TOWERS_BY_NAME
from posenc.models.vision_tower_schemes import Cls as Cls
from posenc.models.vision_tower_schemes import TowerScheme as TowerScheme

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
    cls_angles: tuple[float, ...] | None = None  # a learned CLS angle vector the request gave (`check_cls_angles`)


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
    a rope_type the tower's module refuses is refused ("default" reads as the config class's default rope type,
    e.g. axial, as transformers standardizes it)."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise ParameterError("rope_parameters", f"must be an object, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", scheme.rope_types[0]))
    if rope_type == DEFAULT_ROPE_TYPE:  # as transformers' config: "default" is the class's default_rope_type
        rope_type = scheme.rope_types[0]
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
    model_type where the vision config has none or spells the whole config's (hub files: Qwen2.5-VL's, Qwen3-VL's and
    GLM-4.1V's vision_config say "qwen2_5_vl", "qwen3_vl", "glm4v"; transformers builds the wrapper's vision config
    class from it all the same). None: no vision tower this module knows."""
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
            if section is not None and section.get("model_type") in (None, wrapper) and model_type == wrapper:
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
    if scheme.frequencies == "sequence":
        if head_dim < 2 or head_dim % 2:
            raise ParameterError("head_dim", f"{scheme.title}: the head size must be a positive even number, got "
                                             f"{head_dim}")
    elif scheme.frequencies == "axial3":
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
    elif scheme.frequencies == "sequence":
        per_axis = [default_inv_freq(theta, head_dim)]
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


def sequence_queries(scheme: TowerScheme, tokens: int) -> int:
    """The learned queries a `sequence` tower appends to `tokens` feature tokens (0: none)."""
    if not scheme.queries:
        return 0
    return next((q for q in scheme.queries if tokens <= q), scheme.queries[-1])


def cls_in_table(tower: VisionTower) -> bool:
    """Whether the table holds the tower's CLS rows: zero angles, or learned ones the request gave."""
    cls = tower.scheme.cls
    return cls is not None and (cls.angles == "zero" or tower.cls_angles is not None)


def tower_rows(tower: VisionTower, grid: tuple[int, int, int], merge: int) -> int:
    """Rows of the table: the patches (and a `sequence` tower's queries), plus the CLS rows it holds."""
    t, h, w = grid
    cls = tower.scheme.cls
    extra = 0 if cls is None or not cls_in_table(tower) else (t if cls.per == "frame" else 1)
    return t * h * w + extra + sequence_queries(tower.scheme, h * w)


def cls_row_index(tower: VisionTower, grid: tuple[int, int, int]) -> np.ndarray:
    """int64 [CLS rows]: where the CLS rows sit in a table that holds them (`cls_in_table`)."""
    t, h, w = grid
    cls = tower.scheme.cls
    assert cls is not None
    frames, per = (t, h * w + 1) if cls.per == "frame" else (1, t * h * w + 1)
    return np.arange(frames) * per + (0 if cls.where == "first" else per - 1)


def check_cls_angles(tower: VisionTower, values: Any) -> tuple[float, ...]:
    """A learned CLS angle vector given with the request, validated: the tower has one, as many finite numbers as
    the table has angle columns (the weight's shape [1, n] flattened)."""
    scheme = tower.scheme
    if scheme.cls is None or scheme.cls.angles != "learned":
        raise ParameterError("class_pos_emb", f"{scheme.title} has no learned CLS angles; leave out class_pos_emb")
    n = tower_width(tower, "half")
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], list):
        values = values[0]  # the weight as saved: [1, n]
    if (not isinstance(values, list) or len(values) != n
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)):
        raise ParameterError("class_pos_emb", f"must be a list of {n} numbers (the weight {scheme.learned_cls}, "
                                              f"shape [1, {n}]), got {str(values)[:80]}")
    if not all(np.isfinite(float(v)) for v in values):
        raise ParameterError("class_pos_emb", "the angles must be finite numbers")
    return tuple(float(v) for v in values)


def tower_positions(tower: VisionTower, grid: tuple[int, int, int], merge: int) -> np.ndarray:
    """float64 [rows, 3]: the (t, h, w) position multiplying each axis's frequencies, per row in attention order
    (CLS rows zero; positions offset and scaled as the tower does)."""
    scheme = tower.scheme
    t, h, w = grid
    if scheme.frequencies == "sequence":  # 1-D: the feature tokens, then the queries, positions 0 .. rows - 1
        return np.arange(tower_rows(tower, grid, merge))[:, None] * np.array([1.0, 0.0, 0.0])
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
    if cls is None or not cls_in_table(tower):
        return out
    zero = np.zeros((1, 3))  # learned CLS rows: their angles replace these (`tower_cos_sin`)
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
    if tower.cls_angles is not None:  # the learned CLS rows that fall in this block
        index = cls_row_index(tower, grid)
        index = index[(index >= span.start) & (index < span.stop)] - span.start
        angles[index] = np.asarray(tower.cls_angles, dtype=np.float64)
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
                                          f"learned angles ({scheme.learned_cls}), " +
                                          ("given with the request" if tower.cls_angles is not None else
                                           "not in the table")))
    axes = (", then ".join(f"{a} frequencies" for a in scheme.axes) if scheme.columns == "blocked" else
            "per frequency k: " + ", ".join(f"{a}*f_k" for a in scheme.axes))
    if scheme.frequencies == "sequence":
        order = (f"the h·w feature tokens (raster), then {' or '.join(map(str, scheme.queries))} learned queries "
                 f"(the first at least the tokens, else the last); 1-D positions 0 .. rows - 1")
        axes = "1-D: position times each frequency"
    video = {"repeat": "each frame's table repeated per frame", "temporal": "temporal axis: t position = frame index",
             "images": "images only (t = 1)"}[scheme.video]
    out = {"rows": order + (f"; positions + {scheme.offset}" if scheme.offset else ""),
           "cls_rows": cls_text, "columns": axes, "layout": scheme.pairs, "video": video,
           "head_dim": str(tower.head_dim), "rope_theta": repr(tower.rope_theta)}
    if cls is not None and cls.angles == "learned" and tower.cls_angles is None:
        n = tower_width(tower, "half")
        out["missing_rows"] = (f"the CLS row ({cls.where} per {cls.per}) is left out: its angles are the checkpoint "
                               f"weight {scheme.learned_cls} [1, {n}], which no config holds. Send its {n} values as "
                               f"\"class_pos_emb\": [...] at the top level of the request body for the full table "
                               f"(each CLS row cos/sin(cat(a, a)) of them)")
    return out
