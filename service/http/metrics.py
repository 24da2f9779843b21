"""HTTP's observability: every request recorded in the process's metrics (`posenc.service.metrics`) per route
*template* (`/v2/models/{name}/infer`, not the raw path, so that cardinality stays bounded; unmatched paths are
`unmatched`) — count by method and status, latency histogram, requests in flight, response bytes — and in the
access log; `GET /metrics` exposes the process's metrics, both transports' alike."""

from __future__ import annotations

import time

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from posenc.service.metrics import ACCESS_MESSAGE, Metrics, access_logging, log_access

UNMATCHED = "unmatched"


def route_template(scope: Scope) -> str:
    """The matched route's path template (set on the scope by FastAPI's router), else `unmatched`."""
    route = scope.get("route")
    path = getattr(route, "path_format", None) or getattr(route, "path", None)
    return str(path) if path else UNMATCHED


def scope_header(scope: Scope, name: bytes) -> str | None:
    """The value of header `name` (lower-case bytes) of an ASGI request scope, or None."""
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return bytes(value).decode("latin-1")
    return None


class RequestRecorder:
    """What is recorded of every HTTP request: its metrics and, if enabled, one access-log record."""

    def __init__(self, metrics: Metrics, access_log_enabled: bool = True) -> None:
        self.metrics = metrics
        self.access_log_enabled = access_log_enabled

    def record(self, scope: Scope, status: int, nbytes: int, seconds: float) -> None:
        route = route_template(scope)
        method = str(scope.get("method", ""))
        self.metrics.observe_request(route, method, status, seconds, nbytes)
        if not access_logging(self.access_log_enabled):
            return
        path = scope.get("path", "")
        duration_ms = round(seconds * 1000.0, 3)
        fields = {
            "method": method,
            "path": path,
            "route": route,
            "status": status,
            "duration_ms": duration_ms,
            "bytes": nbytes,
            "request_id": scope_header(scope, b"x-request-id"),
            "client": (scope.get("client") or [None])[0],
        }
        log_access(ACCESS_MESSAGE, (method, path, status, duration_ms, nbytes), fields, "record")


class ObservabilityMiddleware:
    """Pure ASGI middleware: every HTTP request recorded (`RequestRecorder`) once its answer is sent."""

    def __init__(self, app: ASGIApp, recorder: RequestRecorder) -> None:
        self.app = app
        self.recorder = recorder
        self.in_flight = recorder.metrics.in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        seen: dict[str, int] = {"status": 500, "bytes": 0}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = int(message["status"])
            elif message["type"] == "http.response.body":
                seen["bytes"] += len(message.get("body", b""))
            await send(message)

        self.in_flight.inc()
        try:
            await self.app(scope, receive, send_wrapper)
        except Exception:
            # The outermost error middleware turns it into a 500; count it as one.
            seen["status"] = 500
            raise
        finally:
            self.in_flight.dec()
            self.recorder.record(scope, seen["status"], seen["bytes"], time.perf_counter() - start)


router = APIRouter(tags=["operations"])


@router.get("/metrics", summary="Prometheus metrics (text exposition format)", response_class=Response)
def metrics_endpoint(request: Request) -> Response:
    metrics: Metrics = request.app.state.process.metrics
    return Response(content=metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


_SERVED: list[Metrics] = []  # the metrics of the app this process serves (the last one installed)


def count_send_timeout() -> None:
    """Count one connection the server cut for not reading (called by the protocol, which has no app)."""
    if _SERVED:
        _SERVED[-1].send_timeouts.inc()


def install_metrics(app: FastAPI, metrics: Metrics, access_log_enabled: bool) -> RequestRecorder:
    """Record every HTTP request in `metrics` (the process's; `app.state.request_recorder`), add the middleware and
    the `/metrics` route."""
    app.state.request_recorder = RequestRecorder(metrics, access_log_enabled)
    _SERVED[:] = [metrics]
    app.add_middleware(ObservabilityMiddleware, recorder=app.state.request_recorder)
    app.include_router(router)
    return app.state.request_recorder
