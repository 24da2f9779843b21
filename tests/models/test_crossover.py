"""`posenc.models.crossover.start_of_last_run`, which places a model's CPU form (`cpu_form.faster_from`): pure
Python, so the core suite reaches it without torch, onnx or onnxruntime."""

from __future__ import annotations

import subprocess
import sys

import pytest

from posenc.models.crossover import start_of_last_run


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


def test_importing_it_loads_no_model_runtime() -> None:
    code = ("import sys; import posenc.models.crossover; "
            "print(sorted({'torch', 'onnx', 'onnxruntime', 'numpy'} & set(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert loaded.stdout.strip() == "[]", loaded.stdout
