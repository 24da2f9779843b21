"""The serving process assembled once, outside both transports (as Triton's `main.cc` or KServe's `ModelServer`).

`ServiceProcess` owns the settings, the memory budget and the response bodies it counts, the shared-memory
registry, the table cache and its row blocks, the threads of each kind of work, the metrics, and — from `start` to
`close` — the engine and the data plane. HTTP (`posenc.service.http.app.create_app`) and gRPC
(`posenc.service.grpc.server.start_grpc_server`) each take it; neither builds any of it, and both admit a request
through the same step of its data plane (`DataPlane.admitted`) before they read a byte of it.

    process = ServiceProcess(settings)
    async with process.running(in_background=True):   # the models load; the plane exists from here
        ...                                            # transports serve `process`
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from posenc.service import __version__
from posenc.service.budget import BodiesInFlight, MemoryBudget, configure_malloc
from posenc.service.inference.dataplane import STARTING, DataPlane
from posenc.service.inference.runtime.devices import HostPinning
from posenc.service.inference.runtime.engine import Engine
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.metrics import Metrics, multiprocess_dir
from posenc.service.request_kit.threads import thread_kinds
from posenc.service.settings import Settings
from posenc.service.tables.blocks import RowBlocks
from posenc.service.tables.cache import ByteLRUCache

log = logging.getLogger("posenc.process")


class ServiceProcess:
    """Everything one serving process holds, built once from `settings` (nothing here reads the environment)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.table_cache = ByteLRUCache(settings.cache_bytes)
        self.row_blocks = RowBlocks(settings.table_threads, settings.table_block_bytes)
        self.memory_budget = MemoryBudget(settings.memory_budget_bytes, max_waiters=settings.memory_waiters,
                                          wait_seconds=settings.memory_wait_seconds)
        self.bodies_in_flight = BodiesInFlight(self.memory_budget)  # response bodies not yet sent
        self.thread_kinds = thread_kinds(settings)  # audits, checks, tables: threads of their own count each
        configure_malloc(settings.malloc_arenas, settings.malloc_keep_bytes)
        self.readiness_problems: list[str] = [STARTING]  # one list, kept current by the data plane
        self.shared_memory = SharedMemoryRegistry(settings.shared_memory, max_bytes=settings.shared_memory_max_bytes)
        self.metrics = Metrics(cache_of=lambda: self.table_cache, shared_dir=multiprocess_dir())
        self.dataplane: DataPlane | None = None  # from `start` on

    @property
    def engine(self) -> Engine | None:
        return None if self.dataplane is None else self.dataplane.engine

    async def start(self, *, in_background: bool) -> DataPlane:
        """Make the engine and the data plane and load the models: before this returns, or `in_background` (each
        model ready once loaded, the transports serving meanwhile)."""
        plane = DataPlane(Engine(self.settings, observer=self.metrics), self.settings, self.memory_budget,
                          self.shared_memory, problems=self.readiness_problems, observer=self.metrics)
        self.dataplane = plane

        async def on_change() -> None:
            if plane.engine.loaded:
                self._loaded(plane)

        plane.watch(on_change)
        await plane.start(in_background=in_background)
        return plane

    async def close(self) -> None:
        """Stop the models' work and unmap shared memory (the transports have stopped taking requests)."""
        try:
            if self.dataplane is not None:
                await self.dataplane.close()
        finally:
            self.row_blocks.close()

    @asynccontextmanager
    async def running(self, *, in_background: bool) -> AsyncIterator[DataPlane]:
        """`start` … `close`."""
        plane = await self.start(in_background=in_background)
        try:
            yield plane
        finally:
            await self.close()

    def _loaded(self, plane: DataPlane) -> None:
        """Every model loaded (or failed): pin shared memory on CUDA, say so in the log."""
        engine, problems = plane.engine, plane.problems
        if engine.on_cuda and self.settings.cuda_pin_shared_memory and self.shared_memory.pinning is None:
            self.shared_memory.pinning = HostPinning.open()
        if problems:
            log.warning("posenc %s not ready: %s", __version__, "; ".join(problems))
        else:
            log.info("posenc %s ready (%d models)", __version__, len(engine.models))
