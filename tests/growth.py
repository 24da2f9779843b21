"""CPU cost growth checks: a reader fed `factor` times the input must cost about `factor` times the CPU, never
`factor**2`. Both sizes are measured alternately, three rounds, best of each, in CPU seconds of this process
(worker threads included): a shared machine (another test worker on the sibling hyperthread) slows one run, not
the best of three, and the input is built before the clock starts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# Linear growth measures `factor`; quadratic `factor**2`. With a factor of 8 the bound sits at 20, 2.5x from
# either: contention from a test worker on the other hyperthread has been seen to cost 2x.
FACTOR = 8
SLACK = 2.5


def cpu_seconds(call: Callable[[], Any]) -> float:
    start = time.process_time()
    call()
    return time.process_time() - start


def cpu_growth(run: Callable[[Any], Any], small: Any, large: Any, rounds: int = 3) -> tuple[float, float]:
    """The best CPU seconds of `run(small)` and of `run(large)` over `rounds` alternating rounds."""
    small_cpu = large_cpu = float("inf")
    for _ in range(rounds):
        small_cpu = min(small_cpu, cpu_seconds(lambda: run(small)))
        large_cpu = min(large_cpu, cpu_seconds(lambda: run(large)))
    return small_cpu, large_cpu


def assert_linear(run: Callable[[Any], Any], small: Any, large: Any, factor: float = FACTOR) -> tuple[float, float]:
    """`large` is `factor` times `small` in size; its cost must stay under `factor * SLACK` times small's."""
    small_cpu, large_cpu = cpu_growth(run, small, large)
    assert large_cpu / max(small_cpu, 1e-3) < factor * SLACK, (small_cpu, large_cpu)
    return small_cpu, large_cpu
