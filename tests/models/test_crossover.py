"""`posenc.models.crossover`, which places a model's CPU form (the serving machine's calibration,
`posenc.service.inference.calibration`): pure Python, so the core suite reaches it without torch, onnx or
onnxruntime."""

from __future__ import annotations

import subprocess
import sys

import pytest

from posenc.models.crossover import crossover, start_of_last_run


@pytest.mark.parametrize(("faster", "first"), [
    ([False, False, True, True], 2),
    ([True, False, True], 2),  # faster at the shortest only by chance: from where it stays faster
    ([False, True, False, True, True, True], 3),
    ([True, True], 0),
    ([True], 0),
    ([False, True], 1),
    ([True, False], None),  # not faster at the longest: no CPU form
    ([False], None),
    ([], None),
])
def test_the_crossover_is_where_the_last_run_of_wins_starts(faster: list[bool], first: int | None) -> None:
    assert start_of_last_run(faster) == first
    assert start_of_last_run(tuple(faster)) == first  # any sequence


def test_the_crossover_is_the_first_size_from_which_the_second_way_always_wins() -> None:
    sizes = [16, 64, 256, 1024]
    assert crossover(sizes, [1, 2, 3, 4], [2, 1, 4, 3]) == 1024  # a win at 64 that does not last
    assert crossover(sizes, [1, 2, 3, 4], [2, 3, 2, 3]) == 256
    assert crossover(sizes, [1, 2, 3, 4], [0.5, 1, 1, 1]) == 16
    assert crossover(sizes, [1, 2, 3, 4], [0.5, 1, 1, 5]) is None
    assert crossover(sizes, [1, 2, 3, 4], [1, 2, 3, 4]) is None  # a tie is no win
    with pytest.raises(ValueError, match="one time per size"):
        crossover(sizes, [1, 2], [1, 2])


def test_importing_it_loads_no_model_runtime() -> None:
    code = ("import sys; import posenc.models.crossover; "
            "print(sorted({'torch', 'onnx', 'onnxruntime', 'numpy'} & set(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stdout
