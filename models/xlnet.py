"""XLNet / Transformer-XL relative sinusoidal position embedding R_{i−j}.

Reference: transformers 5.23.0 `models/xlnet/modeling_xlnet.py`, `XLNetModel.relative_positional_encoding`
and `positional_embedding`; docs/ENCODINGS.md §12.

Row r is the relative distance klen − r: klen … −qlen + 1 (attn_type `bi`, klen + qlen rows) or klen … 0
(`uni`, klen + 1 rows); columns are [sin | cos] of distance × inv_freq, inv_freq = 10000^(−2k/d_model) in
float32 as the reference computes it. With clamp_len > 0 the distance is clamped to ±clamp_len. With
bi_data the reference adds a backward table whose distances are the negated forward ones (−klen … ).

Precision as RoPE (docs/ENCODINGS.md, precision contract): float32 inv_freq, float64 angles and sin/cos,
cast once. Numpy only.
"""

from typing import Literal

import numpy as np
import numpy.typing as npt

from posenc.models.dtypes import cast
from posenc.models.errors import ParameterError
from posenc.models.rope_types import default_inv_freq
from posenc.models.row_blocks import table_rows

XLNetAttnType = Literal["bi", "uni"]
XLNET_THETA = 10000.0  # hard-coded in the reference


def xlnet_rows(qlen: int, klen: int, attn_type: XLNetAttnType) -> int:
    """Rows of the table: klen + qlen (bi) or klen + 1 (uni)."""
    return klen + qlen if attn_type == "bi" else klen + 1


def check_xlnet_parameters(qlen: int, klen: int, d_model: int) -> None:
    """Positive lengths and an even d_model (the [sin | cos] halves)."""
    for name, value in (("qlen", qlen), ("klen", klen), ("d_model", d_model)):
        if value < 1:
            raise ParameterError(name, f"must be >= 1, got {value}")
    if d_model % 2:
        raise ParameterError("d_model", f"must be even ([sin | cos] halves), got {d_model}")


def xlnet_distances(qlen: int, klen: int, attn_type: XLNetAttnType, bi_data: bool,
                    clamp_len: int, rows: slice | None = None) -> np.ndarray:
    """Relative distance of each row and direction → int64 [rows, 2 if bi_data else 1] (fwd, bwd);
    `rows`: only these rows (`posenc.models.row_blocks.table_rows`)."""
    if attn_type not in ("bi", "uni"):
        raise ParameterError("attn_type", f"must be 'bi' or 'uni', got {attn_type!r}")
    span = table_rows(rows, xlnet_rows(qlen, klen, attn_type))
    forward = np.arange(klen - span.start, klen - span.stop, -1, dtype=np.int64)  # [rows]: klen, klen − 1, …
    columns = [forward, -forward] if bi_data else [forward]  # bwd: arange(−klen, −end) = −fwd
    distances = np.stack(columns, axis=1)  # [rows, 1 | 2]
    if clamp_len > 0:
        distances = np.clip(distances, -clamp_len, clamp_len)
    return distances


def xlnet_relative_sinusoid(
    qlen: int, klen: int, d_model: int, attn_type: XLNetAttnType = "bi", bi_data: bool = False,
    clamp_len: int = -1, dtype: npt.DTypeLike = np.float32, rows: slice | None = None,
) -> np.ndarray:
    """`relative_positional_encoding(qlen, klen)` (bsz=None) → [rows, 2 if bi_data else 1, d_model]; `rows`:
    only these rows of it (`posenc.models.row_blocks.table_rows`), bit for bit as in the whole table."""
    check_xlnet_parameters(qlen, klen, d_model)
    inv_freq = default_inv_freq(XLNET_THETA, d_model).astype(np.float64)  # [d_model/2]
    distances = xlnet_distances(qlen, klen, attn_type, bi_data, clamp_len, rows)  # [rows, n]
    angles = distances[..., None] * inv_freq  # [rows, n, d/2]
    out_dtype = np.dtype(dtype)
    return np.concatenate([cast(np.sin(angles), out_dtype), cast(np.cos(angles), out_dtype)], axis=-1)
