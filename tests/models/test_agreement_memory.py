"""The agreement's memory: `compare` holds at most COMPARE_FLOAT64_ARRAYS float64 arrays of the tensor's size at once
(the figure a check's reservation in the memory budget counts), and computing its temporaries in place changes
none of its figures: they equal the straightforward formulas, written here again without sharing code."""

import math
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from posenc.models.diagnosis.agreement import COMPARE_FLOAT64_ARRAYS, compare, default_tolerance, residual

N = 1 << 20  # elements: large enough that the arrays dwarf everything else traced


def _traced_peak(work: Callable[[], object]) -> int:
    """The most bytes traced while `work` ran (numpy reports its buffers to tracemalloc)."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _reference() -> np.ndarray:
    return np.linspace(-40.0, 40.0, N, dtype=np.float32).reshape(8, 256, 512)


@pytest.mark.parametrize("candidate", ["zeros", "equal", "one-ulp-off"])
def test_compare_holds_at_most_its_float64_arrays(candidate: str) -> None:
    reference = _reference()
    tolerance = default_tolerance(reference)
    upload = {"zeros": np.zeros_like(reference), "equal": reference.copy(),
              "one-ulp-off": np.nextafter(reference, np.float32(np.inf))}[candidate]
    peak = _traced_peak(lambda: compare(upload, reference, tolerance))
    # zeros fail everywhere: the first failure is found without listing every failing index
    assert peak <= COMPARE_FLOAT64_ARRAYS * 8 * N, f"{peak / (8 * N):.2f} float64 arrays"
    peak = _traced_peak(lambda: residual(upload, reference))
    assert peak <= COMPARE_FLOAT64_ARRAYS * 8 * N, f"residual: {peak / (8 * N):.2f} float64 arrays"


def _straightforward(candidate: np.ndarray, reference: np.ndarray, tolerance: np.ndarray | float) -> dict:
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        error = np.abs(cand - ref)
    error[cand == ref] = 0.0
    error[~np.isfinite(error)] = np.inf
    nonzero = (ref != 0) & np.isfinite(ref)
    relative = error[nonzero] / np.abs(ref[nonzero])
    failing = np.argwhere(error > tolerance)
    info = np.finfo(reference.dtype)
    spacing = np.exp2(np.floor(np.log2(np.maximum(np.abs(ref), float(info.smallest_normal))))) * float(info.eps)
    with np.errstate(over="ignore"):
        max_ulp = float((error / spacing).max(initial=0.0))
    return {"max_abs": float(error.max(initial=0.0)), "mean_abs": float(error.sum() / error.size),
            "max_rel": float(relative.max(initial=0.0)), "mean_rel": float(relative.sum() / max(relative.size, 1)),
            "max_ulp": max_ulp, "exact_match_rate": float((error == 0).sum() / error.size),
            "first_failure": tuple(int(i) for i in failing[0]) if len(failing) else None,
            "row_max_abs": error.max(axis=(0, 2)), "column_max_abs": error.max(axis=(0, 1))}


@pytest.mark.parametrize("seed", range(3))
def test_compare_figures_are_the_straightforward_ones(seed: int) -> None:
    rng = np.random.default_rng(seed)
    reference = rng.standard_normal((3, 40, 24)).astype(np.float32)
    reference[0, :3] = 0.0
    reference[1, 5, 5] = -np.inf
    candidate = (reference.astype(np.float64) + rng.standard_normal(reference.shape) * 1e-6).astype(np.float32)
    candidate[2, 7, :] = reference[2, 7, :]
    candidate[0, 9, 3], candidate[1, 5, 5], candidate[2, 1, 1] = np.nan, -np.inf, np.inf
    tolerance = default_tolerance(reference)
    got = compare(candidate, reference, tolerance)
    expected = _straightforward(candidate, reference, tolerance)
    for name, value in expected.items():
        actual = getattr(got, name)
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(actual, value, err_msg=name)
        elif isinstance(value, float) and math.isnan(value):
            assert math.isnan(actual), name
        else:
            assert actual == value, name
    assert got.first_failure is not None and not got.within_contract
