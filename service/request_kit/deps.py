"""Typed dependencies: what a route needs from the app, so that no route outside this room reads `app.state`.

    async def route(settings: SettingsDep, budget: MemoryBudgetDep) -> ...

`create_app` (`posenc.service.http.app`) puts the process (`posenc.service.process.ServiceProcess`) on the app's
state; these functions are the only readers, each room naming what it reads of it (`SharedParts` here, above it
`posenc.service.tables.deps.TableParts`, `posenc.service.inference.deps.InferenceParts`), since no room may import
the process that assembles them. Every one is `async def`: they do no blocking work, and FastAPI runs a sync
dependency in the threadpool (one hop per request). These are the objects every room shares; a room's own objects
have their own dependencies module, so that nothing here names a room above it.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, Request

from posenc.service.budget import BodiesInFlight, MemoryBudget
from posenc.service.request_kit.threads import ThreadKinds
from posenc.service.settings import Settings


class SharedParts(Protocol):
    """What every room reads of the process."""

    settings: Settings
    memory_budget: MemoryBudget
    bodies_in_flight: BodiesInFlight
    thread_kinds: ThreadKinds
    readiness_problems: list[str]

def process_of(request: Request) -> SharedParts:
    """The process the app serves (every room's objects are its)."""
    process: SharedParts = request.app.state.process
    return process


async def settings_of(request: Request) -> Settings:
    return process_of(request).settings


async def memory_budget_of(request: Request) -> MemoryBudget:
    return process_of(request).memory_budget


async def bodies_in_flight_of(request: Request) -> BodiesInFlight:
    return process_of(request).bodies_in_flight


async def thread_kinds_of(request: Request) -> ThreadKinds:
    return process_of(request).thread_kinds


async def readiness_problems_of(request: Request) -> list[str]:
    """Why the service is not ready (empty: ready)."""
    return list(process_of(request).readiness_problems)


SettingsDep = Annotated[Settings, Depends(settings_of)]
MemoryBudgetDep = Annotated[MemoryBudget, Depends(memory_budget_of)]
BodiesInFlightDep = Annotated[BodiesInFlight, Depends(bodies_in_flight_of)]
ReadinessDep = Annotated[list[str], Depends(readiness_problems_of)]
ThreadKindsDep = Annotated[ThreadKinds, Depends(thread_kinds_of)]
