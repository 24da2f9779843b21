"""`posenc.models.crossover`: which of a model's graphs runs at which sequence length, from timings (the serving
machine's calibration, `posenc.service.inference.runtime.calibration`)."""

from __future__ import annotations

import pytest

from posenc.models.crossover import fastest_by_size

SIZES = [16, 64, 256, 1024]


@pytest.mark.parametrize(("seconds", "rule"), [
    ([[1, 2, 3, 4]], [(1, 0)]),  # one way
    ([[1, 2, 3, 4], [2, 3, 4, 5]], [(1, 0)]),  # never faster
    ([[1, 2, 3, 4], [2, 1, 4, 3]], [(1, 0), (33, 1), (129, 0), (513, 1)]),  # wins that come and go, each kept
    ([[1, 2, 3, 4], [0.5, 1, 1, 1]], [(1, 1)]),  # faster everywhere: from 1, below the first size too
    ([[1, 2, 3, 4], [2, 3, 2, 3], [3, 3, 3, 2]], [(1, 0), (129, 1), (513, 2)]),  # three ways
    ([[1, 2, 3, 4], [1, 2, 3, 4]], [(1, 0)]),  # a tie keeps the lower index (the standard graph)
])
def test_each_measured_size_takes_its_fastest_way_from_the_middle_below_it(seconds: list[list[float]],
                                                                           rule: list[tuple[int, int]]) -> None:
    assert fastest_by_size(SIZES, seconds) == rule


def test_the_switch_is_at_the_geometric_middle() -> None:
    # between 256 and 512 the middle is 362.04: 362 is nearer to 256 in ratio, 363 to 512
    assert fastest_by_size([256, 512], [[1, 2], [2, 1]]) == [(1, 0), (363, 1)]


@pytest.mark.parametrize(("sizes", "seconds"), [
    ([], [[]]), ([16], []), ([16, 64], [[1]]), ([64, 16], [[1, 2]]), ([0, 16], [[1, 2]]), ([16, 16], [[1, 2]]),
])
def test_timings_that_do_not_fit_are_refused(sizes: list[int], seconds: list[list[float]]) -> None:
    with pytest.raises(ValueError):
        fastest_by_size(sizes, seconds)
