"""XLNet / Transformer-XL relative sinusoid properties: the sinusoidal measurements (uniqueness,
relativity R_{d+k} = M_k·R_d, R_d·R_0 against d) on the rows R_{i−j} of `relative_positional_encoding`."""

import numpy as np

from posenc.models.properties.measures import adjacent_distance, first_collision_position
from posenc.models.properties.sinusoidal import SinCosPairs, shift_residual
from posenc.models.rope_types import default_inv_freq
from posenc.models.xlnet import XLNET_THETA, XLNetAttnType, xlnet_distances, xlnet_relative_sinusoid


def xlnet_columns(d_model: int) -> SinCosPairs:
    """The [sin | cos] halves of an XLNet row and their frequencies (the reference's float32 inv_freq)."""
    half = np.arange(d_model // 2, dtype=np.int64)
    return SinCosPairs(half, d_model // 2 + half, default_inv_freq(XLNET_THETA, d_model).astype(np.float64))


def xlnet_properties(qlen: int, klen: int, d_model: int, attn_type: XLNetAttnType, bi_data: bool, clamp_len: int,
                     dtype: np.dtype, pairs: int, seed: int) -> tuple[dict[str, np.ndarray],
                                                                      dict[str, float | int | None]]:
    """Properties of the served table [rows, 1 | 2, d_model].

    Curves: distance [D + 1] int64 (0 .. D, D the largest |distance| of the table); pair_distance and
    dot_product [D + 1] float64 (‖R_Δ − R_0‖ and R_Δ·R_0, exact; both even in Δ); adjacent_distance
    [rows − 1] float64 (consecutive forward rows as served); omega [d_model/2] float64; relativity_distance
    [pairs] int64 (the target row's distance) and relativity_residual [pairs] float64: ‖R_b − M_{b−a}·R_a‖ /
    ‖R_b‖ for random served rows a, b (both directions with bi_data) taken at the distance their row
    stands for (klen − row; negated backward): rows clamped by clamp_len break it (order 1).
    """
    served = xlnet_relative_sinusoid(qlen, klen, d_model, attn_type, bi_data, clamp_len, dtype)  # [rows, n, d]
    nominal = xlnet_distances(qlen, klen, attn_type, bi_data, -1)  # [rows, n]
    flat, distances = served.reshape(-1, d_model), nominal.reshape(-1)
    columns = xlnet_columns(d_model)
    largest = int(np.abs(nominal).max())
    exact = xlnet_relative_sinusoid(1, largest, d_model, "uni", False, -1, np.float64)[::-1, 0]  # [D + 1, d]: R_Δ
    pair_curve = np.linalg.norm(exact - exact[0], axis=1)
    adjacent = adjacent_distance(served[:, 0])

    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, flat.shape[0], size=pairs), rng.integers(0, flat.shape[0], size=pairs)
    residual = shift_residual(flat[a], flat[b], columns, distances[b] - distances[a])
    collision = first_collision_position(served[:, 0])
    curves = {"distance": np.arange(largest + 1, dtype=np.int64), "pair_distance": pair_curve,
              "dot_product": exact @ exact[0], "adjacent_distance": adjacent, "omega": columns.omega,
              "relativity_distance": distances[b].astype(np.int64), "relativity_residual": residual}
    clamped = xlnet_distances(qlen, klen, attn_type, bi_data, clamp_len) != nominal
    scalars: dict[str, float | int | None] = {
        "min_pair_distance": float(pair_curve[1:].min()),
        "min_pair_distance_at": int(np.argmin(pair_curve[1:]) + 1),
        "min_adjacent_distance": float(adjacent.min()) if adjacent.size else None,
        "first_collision_distance": None if collision is None else int(nominal[collision, 0]),
        "relativity_max_residual": float(residual.max()),
        "clamped_rows": int(np.count_nonzero(clamped[:, 0])),
    }
    return curves, scalars
