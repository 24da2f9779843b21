"""onnxruntime's CPU arenas handed back once a model is idle.

Each CPU session keeps, in its arena, the buffers of the largest run it has made (the attention scores and their
softmax: 2 × [B, Hq, S, S] float32), for the life of the process: after 30 mixed requests over the shipped models
the idle server stayed at 749 MB (131 MB before them). Turning the arena off hands each run's buffers back at
once, but then every large run faults its pages in again (1.1-1.5 × the time of a run at S=512-1024 on one
core). So the arenas stay on while a model serves, and once it has had no request for `IDLE_SECONDS` each of its
sessions that ran since makes one run of a single position with onnxruntime's arena shrinkage
(`memory.enable_memory_arena_shrinkage`), which frees every region of the arena not in use, and glibc's heaps are
trimmed (`release_free_memory`): the idle server is back within a few MB of its size before the burst, beside
the table cache.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor

import numpy as np
import onnxruntime as ort

from posenc.models.dtypes import BY_KSERVE
from posenc.service.budget import release_free_memory

log = logging.getLogger("posenc.inference.arena")

IDLE_SECONDS = 2.0  # a model without a request this long gives its arenas back
SHRINK = ort.RunOptions()
SHRINK.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")


def one_position(inputs: Mapping[str, tuple[str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """Inputs of one row and one position ({name: (KServe datatype, shape with -1 dynamic)}): zeros, dynamic
    dims 1."""
    return {name: np.zeros([1 if dim == -1 else dim for dim in shape], BY_KSERVE[datatype].numpy)
            for name, (datatype, shape) in inputs.items()}


def shrink(sessions: list[ort.InferenceSession], inputs: Mapping[str, np.ndarray]) -> None:
    """One small run per session with arena shrinkage, then glibc's heaps trimmed (a worker thread)."""
    for session in sessions:
        try:
            session.run(None, dict(inputs), SHRINK)
        except Exception as exc:  # a model that cannot run one position keeps its arena; it still serves
            log.warning("arena shrinkage run failed (%s)", str(exc).strip().splitlines()[-1:])
    release_free_memory()


class IdleShrinker:
    """Remembers which models ran, and shrinks each one's arenas once it has been idle for `IDLE_SECONDS`."""

    def __init__(self, executor: Executor, busy: Callable[[str], bool], idle_seconds: float = IDLE_SECONDS) -> None:
        self.executor = executor
        self.busy = busy  # whether a model has a request in progress
        self.idle_seconds = idle_seconds
        self.shrinks = 0
        self._ran: dict[str, tuple[float, list[ort.InferenceSession], dict[str, np.ndarray]]] = {}
        self._task: asyncio.Task[None] | None = None

    def ran(self, name: str, sessions: list[ort.InferenceSession], inputs: dict[str, np.ndarray]) -> None:
        """Model `name` ran on `sessions` just now (`inputs`: one position for it)."""
        loop = asyncio.get_running_loop()
        previous = self._ran.get(name)
        known = previous[1] if previous else []
        self._ran[name] = (loop.time(), known + [s for s in sessions if s not in known], inputs)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._ran:
            await asyncio.sleep(self.idle_seconds / 2)
            for name, (last, sessions, inputs) in list(self._ran.items()):
                if loop.time() - last >= self.idle_seconds and not self.busy(name):
                    del self._ran[name]
                    await loop.run_in_executor(self.executor, shrink, sessions, inputs)
                    self.shrinks += 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
