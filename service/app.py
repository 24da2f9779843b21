"""Application factory: `create_app(settings)`; nothing here reads the environment at import."""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service import __version__
from service.budget import MemoryBudget, limit_malloc_arenas
from service.cache import ByteLRUCache
from service.engine import Engine
from service.errors import install_error_handlers
from service.fastpath import FastPath, Spellings
from service.metrics import install_metrics
from service.openapi import install_openapi
from service.routes import docs, explorer, health, inference, model_repository, shared_memory
from service.routes.check import check_router
from service.routes.check_inference import router as check_inference_router
from service.settings import Settings
from service.shared_memory import SharedMemoryRegistry
from service.tables.http import table_router

log = logging.getLogger("posenc")



def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the service with `settings` (default: read from `POSENC_*` now, at call time)."""
    settings = settings if settings is not None else Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = Engine(settings, observer=app.state.metrics)
        # Sessions are built before the first request is served; problems make /readyz fail with the reason.
        problems = await asyncio.to_thread(engine.load)
        app.state.engine = engine
        app.state.readiness_problems = problems
        if problems:
            log.warning("posenc %s not ready: %s", __version__, "; ".join(problems))
        else:
            log.info("posenc %s ready (%d models)", __version__, len(engine.models))
        try:
            yield
        finally:
            await engine.close()
            app.state.shared_memory.close()  # unmap every registered region

    app = FastAPI(
        title="posenc",
        version=__version__,
        description="Positional-encoding tables, attention biases and ONNX RoPE-attention inference.",
        lifespan=lifespan,
        # /docs and /redoc come from service.routes.docs: same pages, assets served locally (offline).
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.table_cache = ByteLRUCache(settings.cache_bytes)
    app.state.memory_budget = MemoryBudget(settings.memory_budget_bytes, max_waiters=settings.memory_waiters,
                                           wait_seconds=settings.memory_wait_seconds)
    limit_malloc_arenas(settings.malloc_arenas)
    app.state.readiness_problems = ["starting"]
    app.state.shared_memory = SharedMemoryRegistry(settings.shared_memory)
    install_error_handlers(app)
    install_openapi(app)
    tables = table_router()
    # Routes are matched in this order: the inference routes, the busiest, before the many table routes.
    for router in (health.router, inference.router, model_repository.router, shared_memory.router, tables,
                   docs.router, explorer.router):
        app.include_router(router)
    app.include_router(check_router())
    app.include_router(check_inference_router)
    # Liveness and cached tables answered before routing; observability (added last: outermost) sees them too.
    app.add_middleware(FastPath, cache=app.state.table_cache, spellings=Spellings(),
                       routes=[*health.router.routes, *tables.routes])
    # Observability: GET /metrics, per-route request metrics, the access log.
    install_metrics(app, access_log_enabled=settings.access_log)
    return app


def app_from_env() -> FastAPI:
    """uvicorn factory (`service.app:app_from_env`): settings from the environment of the worker."""
    return create_app(Settings())
