"""One serving process: the process object (`posenc.service.process.ServiceProcess`), assembled once, and its two
transports on it — the HTTP app and, beside it on the same data plane and event loop, the gRPC server.

uvicorn builds the app in each worker through `app_from_env` (settings from the worker's environment). The app's
lifespan starts the process (the data plane made, the models loading), then gRPC on POSENC_GRPC_PORT (0: none);
it stops gRPC before the process closes. The drain after SIGTERM begins for both protocols at once
(`posenc.service.serving.server.Server.shutdown`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from posenc.service.http.app import create_app
from posenc.service.process import ServiceProcess
from posenc.service.settings import Settings


def serving_app(settings: Settings) -> FastAPI:
    """The app of `posenc serve`: its models load while it serves, and gRPC runs beside it when configured."""
    process = ServiceProcess(settings)
    app = create_app(process=process)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with process.running(in_background=True):
            if not settings.grpc_port:
                yield
                return
            from posenc.service.grpc.server import grpc_recorder, start_grpc_server, stop
            from posenc.service.serving.server import GRPC_CUTS

            # the calls a drain cuts are counted in the exit status and logged as their clients saw them
            record = GRPC_CUTS.recorder(grpc_recorder(process.metrics, settings.access_log))
            grpc_server = await start_grpc_server(process, record, workers=settings.workers)
            try:
                yield
            finally:
                await stop(grpc_server, settings.graceful_shutdown_timeout)

    app.router.lifespan_context = lifespan
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory (`posenc.service.serving.process:app_from_env`): settings from the environment of the worker."""
    return serving_app(Settings())
