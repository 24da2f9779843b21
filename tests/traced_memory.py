"""Measuring what a computation allocates (numpy reports its buffers to tracemalloc)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np


def traced_peak(compute: Callable[[], np.ndarray]) -> tuple[np.ndarray, int]:
    """The result of `compute()` and the peak bytes traced while it ran."""
    tracemalloc.start()
    try:
        out = compute()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, peak
