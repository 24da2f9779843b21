"""One serving process: the HTTP app and, beside it on the same data plane and event loop, the gRPC server.

uvicorn builds the app in each worker through `app_from_env` (settings from the worker's environment). The app's
lifespan makes the data plane and begins loading the models (`posenc.service.http.app.create_app`); this lifespan,
around it, then starts gRPC on POSENC_GRPC_PORT (0: none) and stops it before the plane closes. The drain after
SIGTERM begins for both protocols at once (`posenc.service.serving.server.Server.shutdown`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from posenc.service.http.app import create_app
from posenc.service.settings import Settings


def serving_app(settings: Settings) -> FastAPI:
    """The app of `posenc serve`: its models load while it serves, and gRPC runs beside it when configured."""
    app = create_app(settings, load_in_background=True)
    if not settings.grpc_port:
        return app
    http_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with http_lifespan(app):
            from posenc.service.grpc.server import start_grpc_server, stop
            from posenc.service.serving.server import GRPC_CUTS

            # the calls a drain cuts are counted in the exit status and logged as their clients saw them
            record = GRPC_CUTS.recorder(app.state.request_recorder.record_grpc)
            grpc_server = await start_grpc_server(app.state.dataplane, record, workers=settings.workers)
            try:
                yield
            finally:
                await stop(grpc_server, settings.graceful_shutdown_timeout)

    app.router.lifespan_context = lifespan
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory (`posenc.service.serving.process:app_from_env`): settings from the environment of the worker."""
    return serving_app(Settings())
