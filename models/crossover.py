"""Where a second way of computing starts to win: from timings at growing sizes, the first size from which the
second is faster at every larger one. Pure: the timings are measured elsewhere (the CPU form's calibration,
`posenc.service.inference.calibration`)."""

from __future__ import annotations

from collections.abc import Sequence


def start_of_last_run(faster: Sequence[bool]) -> int | None:
    """The index from which every entry of `faster` is true; None when the last is false (or none)."""
    if not faster or not faster[-1]:
        return None
    first = len(faster) - 1
    while first > 0 and faster[first - 1]:
        first -= 1
    return first


def crossover(sizes: Sequence[int], first_seconds: Sequence[float], second_seconds: Sequence[float]) -> int | None:
    """The smallest of `sizes` (ascending) from which the second way's time is below the first's at every larger
    size; None when the second is not faster at the largest. Each time is the best of its runs (other load only
    ever adds time)."""
    if not len(sizes) == len(first_seconds) == len(second_seconds):
        raise ValueError("one time per size and way")
    first = start_of_last_run([second < one for one, second in zip(first_seconds, second_seconds, strict=True)])
    return None if first is None else sizes[first]
