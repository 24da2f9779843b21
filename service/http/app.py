"""Application factory: `create_app(settings)`; nothing here reads the environment at import."""

import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from starlette.types import Receive, Scope, Send

from posenc.service import __version__
from posenc.service.audit.routes import router as audit_router
from posenc.service.budget import BodiesInFlight, MemoryBudget, configure_malloc
from posenc.service.check.routes import check_router
from posenc.service.http import docs, explorer, health
from posenc.service.http.errors import install_error_handlers
from posenc.service.http.fastpath import FastPath
from posenc.service.http.metrics import install_metrics
from posenc.service.http.openapi import install_openapi
from posenc.service.inference import routes as inference_routes
from posenc.service.inference.dataplane import DataPlane
from posenc.service.inference.runtime.devices import HostPinning
from posenc.service.inference.runtime.engine import Engine
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.presets import routes as presets
from posenc.service.properties.routes import properties_router
from posenc.service.request_kit.phases import HEAD_AT
from posenc.service.request_kit.restricted import RestrictedApi
from posenc.service.request_kit.threads import thread_kinds
from posenc.service.request_kit.work import WORK_SCOPE, serving
from posenc.service.settings import Settings
from posenc.service.tables.blocks import RowBlocks
from posenc.service.tables.cache import ByteLRUCache
from posenc.service.tables.routes import table_router

log = logging.getLogger("posenc.http.app")



@functools.cache
def _registry_routers() -> tuple[APIRouter, APIRouter, APIRouter]:
    """The table, properties and check routers, built from the registry once per process: FastAPI analyses every route's
    signature when it is added to a router and again when the router is included in an app, and these are
    the 185 routes whose analysis dominates building an app."""
    return table_router(), properties_router(), check_router()


def create_app(settings: Settings | None = None, *, load_in_background: bool = False) -> FastAPI:
    """Build the service with `settings` (default: read from `POSENC_*` now, at call time). Its lifespan makes the
    data plane (`app.state.dataplane`) and loads the models: before serving, or with `load_in_background` while
    serving, each model not ready until loaded (what `posenc serve` does, `posenc.service.serving.process`)."""
    settings = settings if settings is not None else Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        plane = DataPlane(Engine(settings, observer=app.state.metrics), settings, app.state.memory_budget,
                          app.state.shared_memory, problems=app.state.readiness_problems)
        app.state.dataplane, app.state.engine = plane, plane.engine

        async def on_change() -> None:
            if plane.engine.loaded:
                _loaded(app, plane)

        plane.watch(on_change)
        # In the background, the port opens now: tables, checks and the audit answer at once, each model once loaded.
        await plane.start(in_background=load_in_background)
        try:
            yield
        finally:
            await plane.close()
            app.state.row_blocks.close()

    app = PosencApp(
        title="posenc",
        version=__version__,
        description="Positional-encoding tables, attention biases and ONNX RoPE-attention inference.",
        lifespan=lifespan,
        # /docs and /redoc come from posenc.service.http.docs: same pages, assets served locally (offline).
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.table_cache = ByteLRUCache(settings.cache_bytes)
    app.state.row_blocks = RowBlocks(settings.table_threads, settings.table_block_bytes)
    app.state.memory_budget = MemoryBudget(settings.memory_budget_bytes, max_waiters=settings.memory_waiters,
                                           wait_seconds=settings.memory_wait_seconds)
    app.state.bodies_in_flight = BodiesInFlight(app.state.memory_budget)  # response bodies not yet sent
    app.state.thread_kinds = thread_kinds(settings)  # audits, checks, tables: threads of their own count each
    configure_malloc(settings.malloc_arenas, settings.malloc_keep_bytes)
    app.state.readiness_problems = ["starting"]
    app.state.shared_memory = SharedMemoryRegistry(settings.shared_memory,
                                                   max_bytes=settings.shared_memory_max_bytes)
    install_error_handlers(app)
    install_openapi(app)
    tables, properties, checks = _registry_routers()
    # Routes are matched in this order: the inference routes, the busiest, before the many table routes.
    for router in (health.router, inference_routes.router, inference_routes.shared_memory_router,
                   tables, properties, presets.router, docs.router, explorer.router):
        app.include_router(router)
    app.include_router(checks)
    app.include_router(inference_routes.check_router)
    app.include_router(audit_router)
    # Restricted protocol groups refused before anything answers them (none holds a table or /healthz path,
    # which the fast path answers ahead of every layer).
    app.add_middleware(RestrictedApi, restrictions=settings.restrictions())
    # Observability: GET /metrics, per-route request metrics, the access log.
    install_metrics(app, access_log_enabled=settings.access_log)
    app.fast_path = FastPath(app.full_path, cache=app.state.table_cache, bodies=app.state.bodies_in_flight,
                             routes=[*health.router.routes, *tables.routes, *properties.routes],
                             recorder=app.state.request_recorder)
    return app


def _loaded(app: FastAPI, plane: DataPlane) -> None:
    """Every model loaded (or failed): pin shared memory on CUDA, say so in the log."""
    engine, problems = plane.engine, plane.problems
    if engine.on_cuda and app.state.settings.cuda_pin_shared_memory and app.state.shared_memory.pinning is None:
        app.state.shared_memory.pinning = HostPinning.open()
    if problems:
        log.warning("posenc %s not ready: %s", __version__, "; ".join(problems))
    else:
        log.info("posenc %s ready (%d models)", __version__, len(engine.models))


class PosencApp(FastAPI):
    """FastAPI with posenc's fast path (`posenc.service.http.fastpath`) in front of it: liveness and cached
    tables are answered, and recorded, without FastAPI's per-request work (its root path and telemetry checks)
    or any layer of its middleware stack (error, telemetry, body limit, observability, restricted groups);
    every other request takes `full_path`, FastAPI itself."""

    fast_path: FastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._serve(scope, receive, send)
            return
        scope.setdefault(HEAD_AT, time.perf_counter())  # under another server than posenc's, Server-Timing starts here
        with serving(scope.get(WORK_SCOPE)):  # the request's work, current for its threads and named at shutdown
            await self._serve(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.fast_path is None:
            await self.full_path(scope, receive, send)
        else:
            await self.fast_path(scope, receive, send)

    async def full_path(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
