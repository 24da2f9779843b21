"""The consequence of a file's position facts: the cos/sin tables it implies against the golden ones, row by
row up to its context length, with the first position whose error passes the dtype's contract.

The contract (docs/ENCODINGS.md, precision contract): a float32 reference evaluates position × inv_freq in
float32, so a correct runtime is within (2e-6 + 4e-7·|angle|)·max(1, attention factor) of the golden table;
a stored cache adds one unit in the last place of its dtype. Rows are scanned in blocks (memory bounded by
`BLOCK_ELEMENTS`), and the per-position maxima are kept binned for the picture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from posenc.models.diagnosis.agreement import number, ulp
from posenc.models.dtypes import cast

BLOCK_ELEMENTS = 1 << 19  # float64 elements of one block of rows (4 MiB per array, about ten at a time)
MAX_SCAN = 1 << 20  # positions scanned at most (a longer context is scanned up to here, and the report says so)
MAX_SCAN_ELEMENTS = 1 << 26  # positions × frequencies of one scan (fewer positions for very wide tables)
BINS = 256
VISIBLE = (1e-3, 1e-2, 1e-1)  # error levels a report names the first position of (beyond the contract's)
ANGLE_RTOL = 4e-7
TABLE_ATOL = 2e-6


@dataclass(frozen=True)
class Divergence:
    """first_position: the first position whose error passes the contract (None: none up to `scanned`);
    max_abs: the largest |file − golden| of cos and sin up to `scanned` positions; `bins`: per-position maxima
    (start, stop, max_abs, tolerance) for the picture; `missing_from`: the first position the file has no row
    for (a cache shorter than the context)."""

    scanned: int
    context_length: int
    first_position: int | None
    max_abs: float
    bins: dict[str, list[Any]]
    missing_from: int | None = None
    visible_from: dict[str, int | None] | None = None  # first position whose error passes each VISIBLE level

    @property
    def within_contract(self) -> bool:
        return self.first_position is None and self.missing_from is None

    def document(self) -> dict[str, Any]:
        return {"context_length": self.context_length, "scanned": self.scanned,
                "first_divergent_position": self.first_position, "max_abs_error": number(self.max_abs),
                "missing_from": self.missing_from, "within_contract": self.within_contract,
                "first_position_over": self.visible_from or {}, "bins": self.bins}


def _pad(inv_freq: np.ndarray, n: int) -> np.ndarray:
    """Zero frequencies (channels left unrotated: cos 1, sin 0) up to n columns."""
    out = np.zeros(n, dtype=np.float64)
    out[: inv_freq.shape[0]] = inv_freq.astype(np.float64)[:n]
    return out


class _Bins:
    """Per-position maxima in log-spaced bins (fine near position 0, where divergence starts), and the first
    position over each VISIBLE level."""

    def __init__(self, rows: int) -> None:
        self.visible: dict[str, int | None] = {f"{level:g}": None for level in VISIBLE}
        geometric = np.round(np.geomspace(1, max(rows, 1), BINS)).astype(np.int64)
        starts = np.concatenate([[0], geometric[geometric < rows]])  # sorted, with repeats near 0
        # repeats dropped by hand: np.unique imports numpy.ma (45 ms, a quarter of `posenc audit`'s start-up)
        self.starts = starts[np.diff(starts, prepend=-1) > 0]  # [bins]
        self.error = np.zeros(self.starts.shape[0])
        self.tolerance = np.zeros(self.starts.shape[0])
        self.rows = rows

    def add(self, start: int, row_error: np.ndarray, row_tolerance: np.ndarray) -> None:
        positions = start + np.arange(row_error.shape[0])  # [rows]
        index = np.searchsorted(self.starts, positions, side="right") - 1
        np.maximum.at(self.error, index, row_error)
        np.maximum.at(self.tolerance, index, row_tolerance)
        for level in VISIBLE:
            key = f"{level:g}"
            if self.visible[key] is None:
                over = np.flatnonzero(row_error > level)
                self.visible[key] = start + int(over[0]) if over.size else None

    def document(self) -> dict[str, list[Any]]:
        starts = [int(v) for v in self.starts]
        return {"start": starts, "stop": [*starts[1:], self.rows],
                "max_abs": [number(float(v)) for v in self.error], "tolerance": [float(v) for v in self.tolerance]}


def compare_frequencies(golden: tuple[np.ndarray, float], implied: tuple[np.ndarray, float], context_length: int,
                        dtype: np.dtype | None = None) -> Divergence:
    """Golden and implied tables, each from (float32 inv_freq, attention factor), over positions 0..context−1.
    Frequencies the other side lacks count as unrotated channels. `dtype`: the stored tables' (None: float32
    evaluation, no storage)."""
    n = max(golden[0].shape[0], implied[0].shape[0])
    rows = max(1, min(context_length, MAX_SCAN, MAX_SCAN_ELEMENTS // max(n, 1)))
    g, f = _pad(golden[0], n), _pad(implied[0], n)
    ga, fa = float(golden[1]), float(implied[1])
    bins = _Bins(rows)
    if np.array_equal(g, f) and ga == fa:
        return Divergence(rows, context_length, None, 0.0, bins.document())
    first: int | None = None
    worst = 0.0
    if abs(fa - ga) <= TABLE_ATOL / 2:
        # a column whose frequencies differ by at most half the contract's angle term, with factors within half
        # its constant term, never passes it: its error is at most |fa − ga| + position × |f − g| × the factor
        # (largest on the last row), so only the other columns are scanned
        close = np.abs(f - g) <= ANGLE_RTOL / 2 * np.abs(g)
        bound = abs(fa - ga) + (rows - 1) * np.max(np.abs(f - g)[close], initial=0.0) * max(fa, ga)
        worst = float(bound) if close.any() else 0.0
        g, f = g[~close], f[~close]
        n = g.shape[0]
    block = max(1, BLOCK_ELEMENTS // max(n, 1))
    for start in range(0, rows if n else 0, block):
        positions = np.arange(start, min(start + block, rows), dtype=np.float64)[:, None]  # [b, 1]
        angle_g, angle_f = positions * g, positions * f  # [b, n]
        with np.errstate(invalid="ignore", over="ignore"):
            error = np.maximum(np.abs(fa * np.cos(angle_f) - ga * np.cos(angle_g)),
                               np.abs(fa * np.sin(angle_f) - ga * np.sin(angle_g)))
        error[~np.isfinite(error)] = np.inf  # a NaN or infinite frequency is as far as can be
        tolerance = (TABLE_ATOL + ANGLE_RTOL * np.abs(angle_g)) * max(1.0, ga)
        if dtype is not None:
            tolerance = tolerance + ulp(np.full(1, ga), dtype)
        first, worst = _account(bins, start, error, tolerance, first, worst)
    return Divergence(rows, context_length, first, worst, bins.document(), visible_from=bins.visible)


def _account(bins: _Bins, start: int, error: np.ndarray, tolerance: np.ndarray, first: int | None, worst: float
             ) -> tuple[int | None, float]:
    bins.add(start, error.max(axis=1), tolerance.max(axis=1))
    if first is None:
        failing = np.flatnonzero((error > tolerance).any(axis=1))
        if failing.size:
            first = start + int(failing[0])
    return first, max(worst, float(error.max(initial=0.0)))


def compare_caches(golden: tuple[np.ndarray, float], cos: np.ndarray, sin: np.ndarray, context_length: int
                   ) -> Divergence:
    """Stored cos/sin caches [rows, n] (their dtype the contract's) against the golden table cast once to that
    dtype, positions 0..min(rows, context)−1; a cache shorter than the context is missing from `rows` on."""
    rows_stored = cos.shape[0]
    n = max(golden[0].shape[0], cos.shape[1])
    rows = min(context_length, rows_stored, MAX_SCAN, max(1, MAX_SCAN_ELEMENTS // max(n, 1)))
    g = _pad(golden[0], n)
    ga = float(golden[1])
    bins = _Bins(rows)
    first: int | None = None
    worst = 0.0
    block = max(1, BLOCK_ELEMENTS // max(n, 1))
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        positions = np.arange(start, stop, dtype=np.float64)[:, None]  # [b, 1]
        angle = positions * g  # [b, n]
        golden_cos = cast(ga * np.cos(angle), cos.dtype).astype(np.float64)
        golden_sin = cast(ga * np.sin(angle), cos.dtype).astype(np.float64)
        file_cos = np.ones((stop - start, n))
        file_sin = np.zeros((stop - start, n))
        file_cos[:, : cos.shape[1]] = cos[start:stop].astype(np.float64)
        file_sin[:, : sin.shape[1]] = sin[start:stop].astype(np.float64)
        with np.errstate(invalid="ignore"):
            error = np.maximum(np.abs(file_cos - golden_cos), np.abs(file_sin - golden_sin))
        error[~np.isfinite(error)] = np.inf
        tolerance = (TABLE_ATOL + ANGLE_RTOL * np.abs(angle)) * max(1.0, ga) + ulp(np.full(1, ga), cos.dtype)
        first, worst = _account(bins, start, error, tolerance, first, worst)
    missing = rows_stored if rows_stored < context_length else None
    if first is None:
        first = missing  # the first position without a row differs from the golden table (by all of it)
    return Divergence(rows, context_length, first, worst, bins.document(), missing, bins.visible)
