"""Which way of computing to take at each size, from each way's timings at growing sizes. Pure: the timings are
measured elsewhere (the CPU forms' calibration, `posenc.service.inference.runtime.calibration`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise


def fastest_by_size(sizes: Sequence[int], seconds: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
    """[(from_size, way), ...]: the way to take from each size on, ascending, the first from size 1.

    `seconds[way][i]` is the way's best time at `sizes[i]` (ascending; the best of its runs, as other load only
    ever adds time). A measured size's fastest way runs from the geometric middle between it and the size
    measured before it (a size between two measured ones goes to the nearer in ratio), the first size's fastest
    way below it too, the last one's beyond it. Neighbouring sizes with the same fastest way make one entry; a
    tie goes to the lower way index (the standard graph is way 0)."""
    if not sizes or not seconds or any(len(way) != len(sizes) for way in seconds):
        raise ValueError("one time per size and way, and at least one size and one way")
    if sizes[0] < 1 or any(later <= earlier for earlier, later in pairwise(sizes)):
        raise ValueError("sizes must ascend from 1 or more")
    rule: list[tuple[int, int]] = []
    for index, size in enumerate(sizes):
        way = min(range(len(seconds)), key=lambda w: (seconds[w][index], w))
        if not rule or rule[-1][1] != way:
            rule.append((1 if index == 0 else math.isqrt(sizes[index - 1] * size) + 1, way))
    return rule
