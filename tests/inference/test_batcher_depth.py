"""The batcher's queue depth: every place `admission()` hands out comes back when its request ends, so a model
with `max_queue_size=1` serves one request after another, never refusing the next with a 503."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from posenc.service.inference.runtime.batcher import Batcher


class Depths:
    """A BatchObserver that keeps every queue depth the batcher reports."""

    def __init__(self) -> None:
        self.depths: list[int] = []

    def observe_batch(self, model: str, size: int) -> None:
        pass

    def set_queue_depth(self, model: str, depth: int) -> None:
        self.depths.append(depth)

    def observe_run(self, model: str, seconds: float) -> None:
        pass


def _plus_one(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"output": inputs["x"] + 1}


def test_a_queue_of_one_serves_awaited_requests_one_after_the_other() -> None:
    observer = Depths()

    async def scenario() -> list[np.ndarray]:
        batcher = Batcher(_plus_one, ThreadPoolExecutor(1), max_batch_size=8, max_queue_delay_us=0,
                          max_queue_size=1, observer=observer)
        outputs = []
        try:
            for value in (1.0, 2.0):
                with batcher.admission():  # as the engine does: the place, then the run
                    result = await batcher.run_admitted({"x": np.full((1, 3, 2), value, np.float32)})
                outputs.append(result["output"])
                assert observer.depths[-1] == 0, observer.depths  # the place is given back
            return outputs
        finally:
            await batcher.close()

    first, second = asyncio.run(scenario())
    np.testing.assert_array_equal(first, np.full((1, 3, 2), 2.0, np.float32))
    np.testing.assert_array_equal(second, np.full((1, 3, 2), 3.0, np.float32))
    assert observer.depths == [1, 0, 1, 0]


def test_submit_gives_its_place_back_too() -> None:
    observer = Depths()

    async def scenario() -> None:
        batcher = Batcher(_plus_one, ThreadPoolExecutor(1), max_batch_size=8, max_queue_delay_us=0,
                          max_queue_size=1, observer=observer)
        try:
            for value in (1.0, 2.0, 3.0):
                result = await batcher.submit({"x": np.full((2, 1, 2), value, np.float32)})
                np.testing.assert_array_equal(result["output"], np.full((2, 1, 2), value + 1, np.float32))
        finally:
            await batcher.close()

    asyncio.run(scenario())
    assert observer.depths == [1, 0] * 3
