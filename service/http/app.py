"""The HTTP transport's factory: `create_app(settings)` or `create_app(process=...)`; nothing here reads the environment
at import."""

import functools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from starlette.types import Receive, Scope, Send

from posenc.service import __version__
from posenc.service.audit.routes import router as audit_router
from posenc.service.check.routes import check_router
from posenc.service.http import docs, explorer, health
from posenc.service.http.errors import install_error_handlers
from posenc.service.http.fastpath import FastPath
from posenc.service.http.metrics import install_metrics
from posenc.service.http.openapi import install_openapi
from posenc.service.inference import routes as inference_routes
from posenc.service.presets import routes as presets
from posenc.service.process import ServiceProcess
from posenc.service.properties.routes import properties_router
from posenc.service.request_kit.phases import HEAD_AT
from posenc.service.request_kit.restricted import RestrictedApi
from posenc.service.request_kit.work import WORK_SCOPE, serving
from posenc.service.settings import Settings
from posenc.service.tables.routes import table_router


@functools.cache
def _registry_routers() -> tuple[APIRouter, APIRouter, APIRouter]:
    """The table, properties and check routers, built from the registry once per process: FastAPI analyses every route's
    signature when it is added to a router and again when the router is included in an app, and these are
    the 185 routes whose analysis dominates building an app."""
    return table_router(), properties_router(), check_router()


def create_app(settings: Settings | None = None, *, process: ServiceProcess | None = None,
               load_in_background: bool = False) -> FastAPI:
    """The HTTP transport on `process` (`app.state.process`; the only state the app keeps besides its request
    recorder). Without one, the app assembles its own from `settings` (default: read from `POSENC_*` now, at call
    time) and its lifespan runs it: the models load before serving, or with `load_in_background` while serving, each
    not ready until loaded. A `process` given is run by whoever gave it (`posenc.service.serving.process`, which
    serves its other transports on the same one)."""
    owned = process is None
    if process is None:
        process = ServiceProcess(settings if settings is not None else Settings())
    settings = process.settings

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not owned:
            yield
            return
        async with process.running(in_background=load_in_background):
            yield

    app = PosencApp(
        title="posenc",
        version=__version__,
        description="Positional-encoding tables, attention biases and ONNX RoPE-attention inference.",
        lifespan=lifespan,
        # /docs and /redoc come from posenc.service.http.docs: same pages, assets served locally (offline).
        docs_url=None,
        redoc_url=None,
    )
    app.state.process = process
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
    recorder = install_metrics(app, process.metrics, access_log_enabled=settings.access_log)
    app.fast_path = FastPath(app.full_path, cache=process.table_cache, bodies=process.bodies_in_flight,
                             routes=[*health.router.routes, *tables.routes, *properties.routes], recorder=recorder)
    return app


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
