"""Typed dependencies: what a route needs from the app, so that no route outside this room reads `app.state`.

    async def route(settings: SettingsDep, budget: MemoryBudgetDep) -> ...

`create_app` (`posenc.service.http.app`) puts each object on the app's state; these functions are the only
readers. Every one is `async def`: they do no blocking work, and FastAPI runs a sync dependency in
the threadpool (one hop per request). The engine, the shared-memory registry and the table cache are
named for the type checker only: a room that imports this module loads no other room (no onnxruntime
for the tables, no table families for inference).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from posenc.service.budget import BodiesInFlight, MemoryBudget
from posenc.service.errors import Unavailable
from posenc.service.settings import Settings

if TYPE_CHECKING:
    from posenc.service.inference.runtime.engine import Engine
    from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
    from posenc.service.tables.blocks import RowBlocks
    from posenc.service.tables.cache import ByteLRUCache

STARTING = ["starting"]  # the readiness problems before start-up has finished


async def settings_of(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def memory_budget_of(request: Request) -> MemoryBudget:
    budget: MemoryBudget = request.app.state.memory_budget
    return budget


async def bodies_in_flight_of(request: Request) -> BodiesInFlight:
    bodies: BodiesInFlight = request.app.state.bodies_in_flight
    return bodies


async def table_cache_of(request: Request) -> ByteLRUCache:
    cache: ByteLRUCache = request.app.state.table_cache
    return cache


async def row_blocks_of(request: Request) -> RowBlocks:
    blocks: RowBlocks = request.app.state.row_blocks
    return blocks


async def engine_of(request: Request) -> Engine:
    """The engine once the models are loaded; 503 while the service is starting."""
    engine: Engine | None = getattr(request.app.state, "engine", None)
    if engine is None:
        raise Unavailable("the service is starting: models are not loaded yet", retry_after=1)
    return engine


async def shared_memory_of(request: Request) -> SharedMemoryRegistry:
    """The registry of shared-memory regions (present whether or not the extension is on)."""
    registry: SharedMemoryRegistry = request.app.state.shared_memory
    return registry


async def readiness_problems_of(request: Request) -> list[str]:
    """Why the service is not ready (empty: ready)."""
    return list(getattr(request.app.state, "readiness_problems", STARTING))


SettingsDep = Annotated[Settings, Depends(settings_of)]
MemoryBudgetDep = Annotated[MemoryBudget, Depends(memory_budget_of)]
BodiesInFlightDep = Annotated[BodiesInFlight, Depends(bodies_in_flight_of)]
TableCacheDep = Annotated["ByteLRUCache", Depends(table_cache_of)]
RowBlocksDep = Annotated["RowBlocks", Depends(row_blocks_of)]
EngineDep = Annotated["Engine", Depends(engine_of)]
SharedMemoryDep = Annotated["SharedMemoryRegistry", Depends(shared_memory_of)]
ReadinessDep = Annotated[list[str], Depends(readiness_problems_of)]
