"""Sinusoidal absolute position tables (docs/ENCODINGS.md §6), closed form in float64, cast once.

Variants differ in frequency spacing and column layout:
- paper:         omega_k = base^(-2k/d); interleaved, PE[p, 2k] = sin, PE[p, 2k+1] = cos
                 (Vaswani et al. §3.5; odd d as HF XLM `create_sinusoidal_embeddings`: sin gets the extra column)
- tensor2tensor: omega_k = exp(-k ln(base) / max(d//2 - 1, 1)); [sin | cos], zero column if d is odd
                 (tensor2tensor `get_timing_signal_1d` with min_timescale 1, max_timescale base)
- fairseq:       tensor2tensor spacing with d//2 - 1 (no guard), row `padding_idx` zeroed
                 (fairseq `SinusoidalPositionalEmbedding.get_embedding`; HF M2M100 likewise)
- marian:        paper omega; [sin | cos], sin in the first ceil(d/2) columns (HF `MarianSinusoidalPositionalEmbedding`)
"""

import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import numpy.typing as npt

from posenc.models.bounds import DEFAULT_SINUSOIDAL_BASE
from posenc.models.dtypes import cast
from posenc.models.errors import ParameterError
from posenc.models.row_blocks import table_rows

SinusoidalVariant = Literal["paper", "tensor2tensor", "fairseq", "marian"]
DEFAULT_FAIRSEQ_PADDING_IDX = 1  # fairseq dictionaries' <pad> index


def _libm(function: Callable[[float], float], values: np.ndarray) -> np.ndarray:
    """`function` (a `math` one: the C library's) of each value, float64. numpy's own float64 pow, exp and log
    loops take another code path on AVX-512 CPUs and differ in the last bit, so a table computed with them
    would not be the same bytes on every machine; the C library's scalar functions are."""
    return np.array([function(value) for value in values.tolist()], dtype=np.float64)


def paper_frequencies(count: int, dim: int, base: float) -> np.ndarray:
    """omega_k = base^(-2k/dim), k < count. float64 [count]."""
    exponents = -2.0 * np.arange(count, dtype=np.float64) / dim
    return _libm(lambda e: math.pow(float(base), e), exponents)


def log_spaced_frequencies(count: int, base: float, guard: bool) -> np.ndarray:
    """omega_k = exp(-k ln(base) / (count - 1)), k < count: lowest frequency exactly 1/base. float64 [count].

    tensor2tensor guards the denominator with max(count - 1, 1); fairseq does not (count == 1 divides by 0).
    """
    denominator = max(count - 1, 1) if guard else count - 1
    if denominator == 0:
        raise ParameterError("dim", "fairseq divides by dim//2 - 1, so dim must be at least 4 "
                                    "(the reference raises ZeroDivisionError for dim 2 and 3)")
    return _libm(math.exp, -np.arange(count, dtype=np.float64) * (math.log(float(base)) / denominator))


def _concatenated(angles_sin: np.ndarray, angles_cos: np.ndarray, dim: int) -> np.ndarray:
    """[sin | cos | zero padding up to dim] float64 [P, dim]."""
    out = np.zeros((angles_sin.shape[0], dim), dtype=np.float64)
    n_sin, n_cos = angles_sin.shape[1], angles_cos.shape[1]
    np.sin(angles_sin, out=out[:, :n_sin])
    np.cos(angles_cos, out=out[:, n_sin:n_sin + n_cos])
    return out


def sinusoidal_table(
    max_position: int,
    dim: int,
    variant: SinusoidalVariant = "paper",
    base: float = DEFAULT_SINUSOIDAL_BASE,
    offset: int = 0,
    padding_idx: int = DEFAULT_FAIRSEQ_PADDING_IDX,
    dtype: npt.DTypeLike = np.float32,
    rows: slice | None = None,
) -> np.ndarray:
    """Rows for positions offset .. offset + max_position - 1 of the `variant` table.

    Returns `dtype` [max_position, dim]. `padding_idx` is read by `fairseq` only: the row whose
    position equals it is all zeros (fairseq's table index is the position, real tokens start at
    padding_idx + 1). `rows`: only these rows of that table (`posenc.models.row_blocks.table_rows`),
    bit for bit as in the whole table: [len(rows), dim].
    """
    if max_position < 1:
        raise ParameterError("max_position", f"must be >= 1 (got {max_position})")
    if dim < 1:
        raise ParameterError("dim", f"must be >= 1 (got {dim})")
    if not base > 0:
        raise ParameterError("base", f"must be > 0 (got {base})")
    span = table_rows(rows, max_position)
    first = offset + span.start  # position of the first computed row
    positions = np.arange(first, offset + span.stop, dtype=np.float64)[:, None]  # [P, 1]: P = len(span)

    if variant == "paper":
        omega = paper_frequencies((dim + 1) // 2, dim, base)  # [ceil(d/2)]
        angles = positions * omega  # [P, ceil(d/2)]
        table = np.empty((len(span), dim), dtype=np.float64)
        np.sin(angles, out=table[:, 0::2])
        np.cos(angles[:, : dim // 2], out=table[:, 1::2])
    elif variant == "marian":
        omega = paper_frequencies((dim + 1) // 2, dim, base)  # [ceil(d/2)]
        angles = positions * omega  # [P, ceil(d/2)]
        table = _concatenated(angles, angles[:, : dim // 2], dim)
    elif variant in ("tensor2tensor", "fairseq"):
        omega = log_spaced_frequencies(dim // 2, base, guard=variant == "tensor2tensor")  # [d//2]
        angles = positions * omega  # [P, d//2]
        table = _concatenated(angles, angles, dim)
        if variant == "fairseq" and first <= padding_idx < first + len(span):
            table[padding_idx - first] = 0.0
    else:
        raise ParameterError("variant", f"unknown variant {variant!r}; one of paper, tensor2tensor, fairseq, marian")
    return cast(table, dtype)
