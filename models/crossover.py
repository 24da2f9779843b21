"""Where one of two ways starts to win for good: the crossover of a series of timed comparisons.

Pure Python (no numpy, onnx or onnxruntime): the exporter places a model's CPU form with it
(`cpu_form.faster_from`), and anything else that times two ways at growing sizes can.
"""

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
