"""Measuring what a computation allocates (numpy reports its buffers to tracemalloc)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np


def traced_peak(compute: Callable[[], np.ndarray], tries: int = 3) -> tuple[np.ndarray, int]:
    """The result of `compute()` and the peak bytes traced while it ran: the least of `tries` runs, since
    tracemalloc counts every thread of the process, and another thread of a test process (an earlier test's pool or
    server thread winding down) may allocate during one run; a computation that holds too much does so every run."""
    peaks = []
    for _ in range(tries):
        tracemalloc.start()
        try:
            out = compute()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        peaks.append(peak)
    return out, min(peaks)
