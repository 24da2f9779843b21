"""What the runs of each shape took, the batcher's memory for its choices (`posenc.service.inference.runtime.batcher`):
a run
on the event loop or in a worker thread, a request alone or in a batch.

A shape is a run's batch key (the inputs' shapes without the batch axis, and without the sequence axis where
sequences are padded), rows and sequence length. Each memory holds at most `MAX_SHAPES_TIMED` keys, the oldest
forgotten first: the shapes come from clients, who must not be able to grow it. Runs are recorded from worker
threads (under a lock) and read on the event loop.
"""

from __future__ import annotations

import math
import threading
from typing import TypeVar

BatchKey = tuple[object, ...]  # the inputs' shapes without the batch (and padded sequence) axis, with dtypes
Shape = tuple[BatchKey, int, int]  # a run's batch key, rows and sequence length
K = TypeVar("K")
V = TypeVar("V")

MAX_SHAPES_TIMED = 1024


class RunTimes:
    """The last and the fastest run of each shape, the last seconds per row of each batch key and sequence length,
    and whether requests of a batch key and sequence length were last judged to run alone."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[Shape, float] = {}  # seconds the last run of each shape took
        # Seconds per row of the last run of each batch key and sequence length, whatever its rows: what a run of
        # one would take at least while batches save nothing.
        self._per_row: dict[tuple[BatchKey, int], float] = {}
        # The fastest run of each shape so far, batched or alone: the least disturbed by other load (contention
        # only ever adds time), what batching is judged by (`batch_pays`).
        self._fastest: dict[Shape, float] = {}
        self._alone: dict[tuple[BatchKey, int], bool] = {}

    def record(self, shape: Shape, seconds: float) -> None:
        """A run of `shape` took `seconds` (any thread)."""
        key, rows, seq = shape
        with self._lock:
            remember(self._last, shape, seconds)
            remember(self._per_row, (key, seq), seconds / max(1, rows))
            remember(self._fastest, shape, min(seconds, self._fastest.get(shape, math.inf)))

    def last(self, shape: Shape) -> float | None:
        """Seconds the last run of `shape` took (None before its first)."""
        return self._last.get(shape)

    def shapes(self) -> list[Shape]:
        """The shapes whose last run is remembered, oldest first."""
        return list(self._last)

    def expected(self, key: BatchKey, rows: int, seq: int) -> float:
        """Seconds `rows` rows of this key and sequence length are expected to take at least, at the last run's cost
        per row (0 before the first run)."""
        return self._per_row.get((key, seq), 0.0) * rows

    def batch_pays(self, alone: Shape, batch: Shape) -> bool:
        """Whether a run of `batch` is expected to cost less per row than one of `alone`, from the fastest run of
        each (a batch's time includes joining its inputs and splitting its outputs). Until both have run, it
        does."""
        fastest_alone, fastest_batch = self._fastest.get(alone), self._fastest.get(batch)
        if fastest_alone is None or fastest_batch is None:
            return True
        return fastest_batch / batch[1] < fastest_alone / alone[1]

    def judge(self, key: BatchKey, seq: int, *, alone: bool) -> None:
        """Requests of this key and sequence length were judged to run alone, or not (the event loop's)."""
        remember(self._alone, (key, seq), alone)

    def judged_alone(self, key: BatchKey, seq: int) -> bool:
        """Whether requests of this key and sequence length were last judged to run alone."""
        return self._alone.get((key, seq), False)


def remember(remembered: dict[K, V], key: K, value: V) -> None:
    """`remembered[key] = value`, dropping the oldest key first when `MAX_SHAPES_TIMED` are remembered."""
    if key not in remembered and len(remembered) >= MAX_SHAPES_TIMED:
        del remembered[next(iter(remembered))]
    remembered[key] = value
