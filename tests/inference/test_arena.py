"""onnxruntime's arenas handed back once a model is idle (`posenc.service.inference.runtime.arena.IdleShrinker`):
never while the model has a request in progress, once after it is idle."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posenc.service.inference.runtime.arena import SHRINK, IdleShrinker


class Session:
    """Records the run options of each run (the shrinking run passes SHRINK)."""

    def __init__(self) -> None:
        self.runs: list[Any] = []

    def run(self, outputs: Any, feeds: Any, options: Any = None) -> None:
        self.runs.append(options)


def test_a_model_with_a_request_in_progress_is_never_shrunk() -> None:
    session, busy = Session(), {"m": True}

    async def scenario() -> tuple[int, int]:
        with ThreadPoolExecutor(1) as executor:
            shrinker = IdleShrinker(executor, lambda name: busy[name], idle_seconds=0.02)
            shrinker.ran("m", [session], {})  # type: ignore[list-item]
            await asyncio.sleep(0.3)  # fifteen idle periods, the request still in progress
            while_busy = shrinker.shrinks
            busy["m"] = False
            async with asyncio.timeout(10):
                while shrinker.shrinks == 0:
                    await asyncio.sleep(0.01)
            await shrinker.close()
            return while_busy, shrinker.shrinks

    assert asyncio.run(scenario()) == (0, 1)
    assert session.runs == [SHRINK]  # one shrinking run, once the request was over
