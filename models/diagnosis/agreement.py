"""How far a candidate tensor is from a reference one: the agreement figures of a check.

Pure numpy. Both tensors are compared in float64 (integers exactly); the tolerance is the family's
precision contract (docs/ENCODINGS.md), given per element by the caller. Rows are the axis of
positions (axis −2 of a 2-D or 3-D table, axis 0 of a vector), columns the last axis; their
summaries are binned to at most `MAX_SUMMARY_BINS` entries so the answer stays small for any table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

MAX_SUMMARY_BINS = 64
# The most float64 arrays of the compared tensor's size `compare` holds at once, beside its inputs: the
# reference and the error, with two more while the relative error is computed or the ulps counted (measured
# 4.1 with its boolean masks, an eighth each), rounded up. A caller that bounds a comparison's memory counts this.
COMPARE_FLOAT64_ARRAYS = 5


@dataclass(frozen=True)
class Agreement:
    """Agreement of one tensor. Errors are absolute, in float64; `max_ulp` is in units of the reference
    dtype's last place (None for integers); `first_failure` is the index of the first element (row-major)
    whose error passes the tolerance (None: all within)."""

    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    mean_abs: float
    max_rel: float
    mean_rel: float
    max_ulp: float | None
    exact_match_rate: float
    within_contract: bool
    first_failure: tuple[int, ...] | None
    row_max_abs: np.ndarray  # float64 [rows]
    column_max_abs: np.ndarray  # float64 [columns] (empty for a vector)

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures, per-row and per-column maxima binned to at most MAX_SUMMARY_BINS."""
        return {
            "shape": list(self.shape), "dtype": self.dtype, "max_abs": number(self.max_abs),
            "mean_abs": number(self.mean_abs), "max_rel": number(self.max_rel), "mean_rel": number(self.mean_rel),
            "max_ulp": None if self.max_ulp is None else number(self.max_ulp),
            "exact_match_rate": self.exact_match_rate, "within_contract": self.within_contract,
            "first_failure": None if self.first_failure is None else list(self.first_failure),
            "rows": binned(self.row_max_abs), "columns": binned(self.column_max_abs),
        }


def number(value: float) -> float | str:
    """JSON has no infinities: "Infinity" / "NaN" as the service's json format spells them."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def binned(values: np.ndarray, bins: int = MAX_SUMMARY_BINS) -> dict[str, list[Any]]:
    """Maxima of consecutive runs: {"start": [...], "stop": [...], "max_abs": [...]} (at most `bins` runs)."""
    n = len(values)
    if n == 0:
        return {"start": [], "stop": [], "max_abs": []}
    step = math.ceil(n / bins)
    starts = list(range(0, n, step))
    return {"start": starts, "stop": [min(s + step, n) for s in starts],
            "max_abs": [number(float(values[s:s + step].max())) for s in starts]}


def ulp(reference: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Spacing of `dtype` at each |reference| value (subnormal spacing below the smallest normal). float64."""
    info = ml_dtypes.finfo(dtype) if dtype == np.dtype(ml_dtypes.bfloat16) else np.finfo(dtype)
    magnitude = np.maximum(np.abs(reference), float(info.smallest_normal))
    # in place: one array of the reference's size beside it, not one per step
    np.log2(magnitude, out=magnitude)
    np.floor(magnitude, out=magnitude)
    np.exp2(magnitude, out=magnitude)
    magnitude *= float(info.eps)
    return magnitude


def default_tolerance(reference: np.ndarray) -> np.ndarray | float:
    """Cast-once tables: one unit in the last place of the reference dtype; integers: exact."""
    if reference.dtype.kind in "iub":
        return 0.0
    return ulp(reference.astype(np.float64), reference.dtype)


def _row_column_axes(ndim: int) -> tuple[int, int | None]:
    return (max(ndim - 2, 0), ndim - 1 if ndim >= 2 else None)


def _max_ulp(error: np.ndarray, reference: np.ndarray, dtype: np.dtype) -> float:
    """Largest error in units of the reference dtype's last place (inf: beyond float64's range)."""
    spacing = ulp(reference, dtype)
    with np.errstate(over="ignore"):
        return float(np.divide(error, spacing, out=spacing).max(initial=0.0))


def _abs_error(candidate: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|candidate − reference| in float64: equal values (masked −inf included) 0, other non-finite inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.subtract(candidate, reference)
        np.abs(error, out=error)
    error[candidate == reference] = 0.0
    error[~np.isfinite(error)] = np.inf
    return error


def compare(candidate: np.ndarray, reference: np.ndarray, tolerance: np.ndarray | float) -> Agreement:
    """Agreement of `candidate` with `reference` (same shape; any numeric dtypes), `tolerance` absolute,
    broadcastable to the shape. Non-finite candidates count as infinitely far."""
    if candidate.shape != reference.shape:
        raise ValueError(f"shape {candidate.shape} differs from the reference's {reference.shape}")
    # at most COMPARE_FLOAT64_ARRAYS float64 arrays of the tensor's size at once: each temporary is computed in
    # place where it can be, and freed as soon as it is used
    ref = reference.astype(np.float64)
    error = _abs_error(candidate.astype(np.float64), ref)
    size = max(error.size, 1)
    nonzero = (ref != 0) & np.isfinite(ref)
    relative = error[nonzero]
    magnitude = ref[nonzero]
    np.abs(magnitude, out=magnitude)
    relative /= magnitude
    del magnitude
    max_rel, mean_rel = float(relative.max(initial=0.0)), float(relative.sum() / max(relative.size, 1))
    del relative, nonzero
    failing = error > tolerance
    # the first failing element in row-major order (np.argwhere would list every one of them first)
    first = np.unravel_index(int(np.argmax(failing)), failing.shape) if failing.any() else None
    del failing
    row_axis, column_axis = _row_column_axes(error.ndim)
    other_rows = tuple(a for a in range(error.ndim) if a != row_axis)
    other_columns = tuple(a for a in range(error.ndim) if a != column_axis)
    is_float = reference.dtype.kind == "f" or reference.dtype == np.dtype(ml_dtypes.bfloat16)
    return Agreement(
        shape=tuple(reference.shape),
        dtype=str(candidate.dtype),
        max_abs=float(error.max(initial=0.0)),
        mean_abs=float(error.sum() / size),
        max_rel=max_rel,
        mean_rel=mean_rel,
        max_ulp=_max_ulp(error, ref, reference.dtype) if is_float else None,
        exact_match_rate=float((error == 0).sum() / size),
        within_contract=first is None,
        first_failure=None if first is None else tuple(int(i) for i in first),
        row_max_abs=error.max(axis=other_rows, initial=0.0) if error.ndim else error.reshape(1),
        column_max_abs=(error.max(axis=other_columns, initial=0.0) if column_axis is not None
                        else np.zeros(0)),
    )


def residual(candidate: np.ndarray, hypothesis: np.ndarray) -> float:
    """How far a hypothesis is from the candidate: max abs error for floats, mismatch rate for integers."""
    if candidate.shape != hypothesis.shape:
        return math.inf
    diff = _abs_error(candidate.astype(np.float64), hypothesis.astype(np.float64))
    if hypothesis.dtype.kind in "iub":
        return float((diff != 0).sum() / max(diff.size, 1))
    return float(diff.max(initial=0.0))
