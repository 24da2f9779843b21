"""Application factory: `create_app(settings)`; nothing here reads the environment at import."""

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

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
from posenc.service.inference.runtime.calibration_child import CHILD_BYTES
from posenc.service.inference.runtime.devices import HostPinning
from posenc.service.inference.runtime.engine import Engine
from posenc.service.request_kit.phases import HEAD_AT
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.presets import routes as presets
from posenc.service.properties.routes import properties_router
from posenc.service.request_kit.restricted import RestrictedApi
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


def create_app(settings: Settings | None = None, *, grpc: bool = False, load_in_background: bool = False) -> FastAPI:
    """Build the service with `settings` (default: read from `POSENC_*` now, at call time). `grpc`: its lifespan
    also runs the gRPC server on POSENC_GRPC_PORT; `load_in_background`: the app serves while its models load,
    each model not ready until loaded (both what `posenc serve` does; an in-process app, as in tests, leaves them
    off and has every model loaded when its lifespan has started)."""
    settings = settings if settings is not None else Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = Engine(settings, observer=app.state.metrics)
        app.state.engine = engine
        problems: list[str] = app.state.readiness_problems  # one list, kept current: gRPC's readiness reads it too
        grpc_server = await _start_grpc(app, settings, engine, problems) if grpc and settings.grpc_port else None

        async def on_change() -> None:
            problems[:] = engine.problems() if engine.loaded or engine.models else ["starting"]
            if grpc_server is not None:
                from posenc.service.grpc.server import update_health

                await update_health(grpc_server, problems, engine.models)
            if engine.loaded:
                _loaded(app, engine, problems)

        if load_in_background:
            # The port opens now: tables, checks and the audit answer at once, each model once it is loaded.
            loader = asyncio.create_task(engine.load_in_background(
                lambda: app.state.memory_budget.hold(CHILD_BYTES, "the CPU-graph calibration of a model"),
                on_change))
        else:
            await asyncio.to_thread(engine.load)
            await on_change()
        try:
            yield
        finally:
            if load_in_background and not loader.done():
                loader.cancel()
            if grpc_server is not None:
                from posenc.service.grpc.server import stop

                await stop(grpc_server, settings.graceful_shutdown_timeout)
            await engine.close()
            app.state.shared_memory.close()  # unmap every registered region
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


def _loaded(app: FastAPI, engine: Engine, problems: list[str]) -> None:
    """Every model loaded (or failed): pin shared memory on CUDA, say so in the log."""
    if engine.on_cuda and app.state.settings.cuda_pin_shared_memory and app.state.shared_memory.pinning is None:
        app.state.shared_memory.pinning = HostPinning.open()
    if problems:
        log.warning("posenc %s not ready: %s", __version__, "; ".join(problems))
    else:
        log.info("posenc %s ready (%d models)", __version__, len(engine.models))


async def _start_grpc(app: FastAPI, settings: Settings, engine: Engine, problems: list[str]) -> Any:
    """The gRPC server on the app's own engine, budget, shared memory and recorder."""
    from posenc.service.grpc.server import start_grpc_server
    from posenc.service.grpc.servicer import GrpcState

    state = GrpcState(engine, settings, app.state.memory_budget, app.state.shared_memory, problems,
                      app.state.request_recorder.record_grpc)
    return await start_grpc_server(state, workers=settings.workers)


class PosencApp(FastAPI):
    """FastAPI with posenc's fast path (`posenc.service.http.fastpath`) in front of it: liveness and cached
    tables are answered, and recorded, without FastAPI's per-request work (its root path and telemetry checks)
    or any layer of its middleware stack (error, telemetry, body limit, observability, restricted groups);
    every other request takes `full_path`, FastAPI itself."""

    fast_path: FastPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":  # under another server than posenc's, Server-Timing starts here
            scope.setdefault(HEAD_AT, time.perf_counter())
        if self.fast_path is None:
            await self.full_path(scope, receive, send)
        else:
            await self.fast_path(scope, receive, send)

    async def full_path(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


def app_from_env() -> FastAPI:
    """uvicorn factory (`posenc.service.http.app:app_from_env`): settings from the environment of the worker."""
    return create_app(Settings(), grpc=True, load_in_background=True)
