"""Typed dependencies: what a route needs from the app, so that no route outside this room reads `app.state`.

    async def route(settings: SettingsDep, budget: MemoryBudgetDep) -> ...

`create_app` (`posenc.service.http.app`) puts each object on the app's state; these functions are the only
readers. Every one is `async def`: they do no blocking work, and FastAPI runs a sync dependency in
the threadpool (one hop per request). These are the objects every room shares; a room's own objects have their
own dependencies module (`posenc.service.tables.deps`, `posenc.service.inference.deps`), so that nothing here
names a room above it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from posenc.service.budget import BodiesInFlight, MemoryBudget
from posenc.service.request_kit.threads import ThreadKinds
from posenc.service.settings import Settings

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


async def thread_kinds_of(request: Request) -> ThreadKinds:
    kinds: ThreadKinds = request.app.state.thread_kinds
    return kinds


async def readiness_problems_of(request: Request) -> list[str]:
    """Why the service is not ready (empty: ready)."""
    return list(getattr(request.app.state, "readiness_problems", STARTING))


SettingsDep = Annotated[Settings, Depends(settings_of)]
MemoryBudgetDep = Annotated[MemoryBudget, Depends(memory_budget_of)]
BodiesInFlightDep = Annotated[BodiesInFlight, Depends(bodies_in_flight_of)]
ReadinessDep = Annotated[list[str], Depends(readiness_problems_of)]
ThreadKindsDep = Annotated[ThreadKinds, Depends(thread_kinds_of)]
