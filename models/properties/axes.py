"""Properties of multi-axis RoPE tables, each frequency driven by one position axis: vision 2-D RoPE
(Pixtral, Llama 4 vision; axes height, width) and M-RoPE (Qwen2-VL family; axes t, h, w).

Per axis: each frequency's wavelength against the positions the axis spans, and relativity
⟨R(q, p), R(k, p')⟩ = a·⟨q, R(k, p' − p)⟩ on that axis's frequencies (rows of p and p' as served, the
rotation by p' − p built like them: `rope_rows`). Over all frequencies: norm preservation and the
uniqueness of the served rows. Rotations use the half layout (inner products do not depend on it).
"""

from collections.abc import Sequence

import numpy as np

from posenc.models.mrope import SectionOrder, mrope_axis, mrope_cos_sin
from posenc.models.properties.measures import adjacent_distance, first_collision_position
from posenc.models.properties.rope import relativity_residual, rope_rows, rotate
from posenc.models.rope_params import RopeParameters
from posenc.models.vision_rope import VisionRopeModel, vision_cos_sin, vision_positions

Measured = tuple[dict[str, np.ndarray], dict[str, float | int | str | None]]
VISION_AXES = ("height", "width")
MROPE_AXES = ("t", "h", "w")


def axis_relativity(cos: np.ndarray, sin: np.ndarray, inv_freq: np.ndarray, axis_of: np.ndarray,
                    positions: np.ndarray, factor: float, axis: int, pairs: int,
                    rng: np.random.Generator) -> np.ndarray:
    """|⟨R(q, p_i), R(k, p_j)⟩ − a·⟨q, R(k, p_j − p_i)⟩| / (a²‖q‖‖k‖) on the frequencies of `axis`,
    random rows i, j. cos/sin: served [N, F] (one column per frequency); axis_of: int64 [F];
    positions: int64 [N, axes] → float64 [pairs]."""
    cols = np.flatnonzero(axis_of == axis)
    i, j = rng.integers(0, cos.shape[0], size=pairs), rng.integers(0, cos.shape[0], size=pairs)
    q, k = rng.standard_normal((pairs, 2 * cols.size)), rng.standard_normal((pairs, 2 * cols.size))
    q_i, k_j = rotate(q, cos[i][:, cols], sin[i][:, cols]), rotate(k, cos[j][:, cols], sin[j][:, cols])
    relative = rope_rows(inv_freq[cols], factor, positions[j, axis] - positions[i, axis], cos.dtype)
    return relativity_residual(q, k, q_i, k_j, rotate(k, *relative), factor)


def norm_ratio(cos: np.ndarray, sin: np.ndarray, factor: float, pairs: int, rng: np.random.Generator) -> np.ndarray:
    """‖R(x, p)‖ / (a‖x‖) for random x and served rows p: float64 [pairs]."""
    rows = rng.integers(0, cos.shape[0], size=pairs)
    x = rng.standard_normal((pairs, 2 * cos.shape[1]))
    return np.linalg.norm(rotate(x, cos[rows], sin[rows]), axis=1) / (factor * np.linalg.norm(x, axis=1))


def axis_measures(cos: np.ndarray, sin: np.ndarray, inv_freq: np.ndarray, axis_of: np.ndarray,
                  positions: np.ndarray, factor: float, names: Sequence[str], pairs: int, seed: int) -> Measured:
    """What both families share: wavelength per frequency against the span of its axis (positions
    max − min + 1), relativity per axis, norm preservation."""
    rng = np.random.default_rng(seed)
    spans = positions.max(axis=0) - positions.min(axis=0) + 1  # [axes]
    wavelength = 2.0 * np.pi / inv_freq.astype(np.float64)
    turns = wavelength <= spans[axis_of]
    curves: dict[str, np.ndarray] = {"inv_freq": inv_freq, "wavelength": wavelength, "axis": axis_of.astype(np.int64),
                                     "completes_turn": turns}
    scalars: dict[str, float | int | str | None] = {"axes": ",".join(names)}
    for axis, name in enumerate(names):
        residual = axis_relativity(cos, sin, inv_freq, axis_of, positions, factor, axis, pairs, rng)
        curves[f"relativity_residual_{name}"] = residual
        scalars |= {f"span_{name}": int(spans[axis]), f"turning_dimensions_{name}": int(np.count_nonzero(
            turns[axis_of == axis])), f"relativity_max_residual_{name}": float(residual.max())}
    ratio = norm_ratio(cos, sin, factor, pairs, rng)
    curves["norm_ratio"] = ratio
    scalars["norm_max_deviation"] = float(np.max(np.abs(ratio - 1.0)))
    return curves, scalars


def vision_axes(model: VisionRopeModel, head_dim: int, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions int64 [rows, 2] as (h, w) and the axis of each frequency int64 [head_dim/2] (0 h, 1 w):
    Pixtral's halves are (row, column), Llama 4's (x = column, y = row)."""
    positions = vision_positions(model, height, width)
    halves = [0, 1] if model == "pixtral" else [1, 0]
    return (positions if model == "pixtral" else positions[:, ::-1]), np.repeat(halves, head_dim // 4)


def vision_properties(model: VisionRopeModel, head_dim: int, theta: float, height: int, width: int,
                      dtype: np.dtype, pairs: int, seed: int) -> Measured:
    """Properties of the served vision table (every row, Llama 4's CLS too).

    Curves: inv_freq [F] float32, wavelength [F], axis [F] int64 (0 height, 1 width), completes_turn [F]
    bool (wavelength <= the patches along its axis), pair_distance [height, width] float64 (‖row(p) −
    row(p + (Δh, Δw))‖ of the full-form rows, exact: depends on (|Δh|, |Δw|) only), relativity_residual_height,
    relativity_residual_width and norm_ratio [pairs] float64 (served rows).
    """
    cos, sin, freqs = vision_cos_sin(model, head_dim, theta, height, width, "half", dtype)  # [rows, F]
    positions, axis_of = vision_axes(model, head_dim, height, width)
    curves, scalars = axis_measures(cos, sin, freqs, axis_of, positions, 1.0, VISION_AXES, pairs, seed)
    theta64 = freqs.astype(np.float64)
    per_axis = [4.0 * (1.0 - np.cos(np.outer(np.arange(n), theta64[axis_of == a]))).sum(axis=1)
                for a, n in enumerate((height, width))]  # [n] each: Σ 2·(2 − 2cos) over the axis's frequencies
    distance = np.sqrt(per_axis[0][:, None] + per_axis[1][None, :])  # [height, width]
    curves["pair_distance"] = distance
    masked = np.where(distance > 0, distance, np.inf)
    masked[0, 0] = np.inf
    at = np.unravel_index(int(np.argmin(masked)), masked.shape)
    served = np.concatenate([cos, sin], axis=1)  # [rows, 2F]
    collision = first_collision_position(served)
    scalars |= {
        "min_pair_distance": float(masked[at]) if np.isfinite(masked[at]) else None,
        "min_pair_distance_at": f"{at[0]},{at[1]}" if np.isfinite(masked[at]) else None,
        "first_collision_row": collision,
        "cls_min_distance": (float(np.sqrt(2.0) * np.min(np.linalg.norm(
            served[:-1].astype(np.float64) - served[-1].astype(np.float64), axis=1))) if model == "llama4" else None),
    }
    return curves, scalars


def mrope_properties(params: RopeParameters, position_ids: np.ndarray, section: Sequence[int],
                     interleaved: SectionOrder | bool, dtype: np.dtype, pairs: int, seed: int) -> Measured:
    """Properties of the served M-RoPE cos/sin for position ids int64 [3, S].

    Curves: those of `axis_measures` per section t, h, w (span = the positions that axis reaches in this
    sequence) and adjacent_distance [S − 1] float64 (consecutive tokens' full-form rows as served). Scalars
    add distinct_positions (distinct (t, h, w) triples), distinct_rows and first_collision_token (the first
    token whose served row equals an earlier token's although their positions differ; None: never).
    """
    cos_full, sin_full, inv_freq, factor = mrope_cos_sin(params, position_ids, section, interleaved, dtype)
    half = inv_freq.size
    cos, sin = cos_full[:, :half], sin_full[:, :half]  # [S, F]: cat(f, f) holds each value twice
    positions = np.ascontiguousarray(position_ids.T)  # [S, 3]
    axis = mrope_axis(section, interleaved, params.n_frequencies)  # [F]
    curves, scalars = axis_measures(cos, sin, inv_freq, axis, positions, factor, MROPE_AXES, pairs, seed)
    served = np.concatenate([cos, sin], axis=1)
    adjacent = np.sqrt(2.0) * adjacent_distance(served)
    moves = np.any(positions[1:] != positions[:-1], axis=1)
    curves["adjacent_distance"] = adjacent
    seen: dict[bytes, bytes] = {}
    collision = None
    for token in range(served.shape[0]):
        row, where = served[token].tobytes(), positions[token].tobytes()
        if seen.setdefault(row, where) != where and collision is None:
            collision = token
    scalars |= {"attention_factor": factor, "sequence_length": int(positions.shape[0]),
                "distinct_positions": int(np.unique(positions, axis=0).shape[0]), "distinct_rows": len(seen),
                "first_collision_token": collision,
                "min_adjacent_distance": float(adjacent[moves].min()) if moves.any() else None}
    return curves, scalars
