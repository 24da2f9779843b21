"""Prometheus metrics (`GET /metrics`) and the per-request access log.

Every app gets its own `CollectorRegistry` (never the process-global default one), so several apps in
one process — tests, `posenc table` — do not collide.

What the rest of the service reports (the engine's batchers, through
`posenc.service.inference.runtime.batcher.BatchObserver`;
`create_app` hands them the app's `Metrics`):

- `metrics.observe_batch(model, size)`: one onnxruntime batch of `size` requests was formed.
- `metrics.set_queue_depth(model, n)`: `n` requests are waiting in the model's batcher queue now.
- `metrics.observe_run(model, seconds)`: one `session.run` took `seconds` of wall time.

The HTTP middleware records, per route *template* (`/v2/models/{name}/infer`, not the raw path,
so that cardinality stays bounded; unmatched paths are `unmatched`): request count by method and
status, latency histogram, requests in flight, and response bytes. The table cache's hits, misses and
bytes are read from `app.state.table_cache` at scrape time.

Several workers (`posenc serve` with `POSENC_WORKERS` > 1): `shared_metrics_dir` gives the worker processes a
shared directory (`PROMETHEUS_MULTIPROC_DIR`), so prometheus_client backs every value with a per-process mmap
file there, and `/metrics` — whichever worker answers — sums the files of all workers: counters and histograms
are exact totals; the gauges `posenc_http_requests_in_flight`, `posenc_queue_depth` and the table cache gauges
are summed over live workers; the cache's hit and miss counters are copied into shared counters after every
request. One worker (and every app in tests) keeps the in-memory registry.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from posenc.service import __version__

access_log = logging.getLogger("posenc.access")  # docs/operations.md documents this name: logs filter on it
ACCESS_MESSAGE = "%s %s %d %.1fms %dB"  # method, path, status, duration, response bytes
GRPC_ACCESS_MESSAGE = "%s %s %s %.1fms %dB"  # GRPC, method path, code, duration, response bytes (a stream: responses)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
RUN_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
UNMATCHED = "unmatched"
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's variable, read when it is imported


def multiprocess_dir() -> str | None:
    """The shared metrics directory when this process's prometheus_client values are file-backed, else None."""
    if not getattr(values.ValueClass, "_multiprocess", False):
        return None
    return os.environ.get(MULTIPROCESS_ENV)


@contextlib.contextmanager
def shared_metrics_dir() -> Iterator[str]:
    """`PROMETHEUS_MULTIPROC_DIR` for the worker processes started inside (they must be spawned, not forked
    after prometheus_client was imported): the caller's own directory, emptied of stale `*.db` files (counts
    of an earlier run would be added), or a fresh temporary one, removed at the end."""
    given = os.environ.get(MULTIPROCESS_ENV)
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix="posenc-metrics-"))
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROCESS_ENV] = str(path)
    try:
        yield str(path)
    finally:
        if given is None:
            os.environ.pop(MULTIPROCESS_ENV, None)
            shutil.rmtree(path, ignore_errors=True)


class TableCacheCollector(Collector):
    """Reads the table cache's counters when scraped (the cache itself knows nothing of Prometheus)."""

    def __init__(self, cache_of: Callable[[], Any]) -> None:
        self._cache_of = cache_of

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        cache = self._cache_of()
        if cache is None:
            return
        yield CounterMetricFamily("posenc_table_cache_hits", "Table requests answered from the cache.",
                                  value=cache.hits)
        yield CounterMetricFamily("posenc_table_cache_misses", "Table requests computed (not in the cache).",
                                  value=cache.misses)
        yield GaugeMetricFamily("posenc_table_cache_bytes", "Bytes of encoded tables held in the cache.",
                                value=cache.size_bytes)
        yield GaugeMetricFamily("posenc_table_cache_capacity_bytes", "Byte budget of the cache (POSENC_CACHE_BYTES).",
                                value=cache.capacity)
        yield GaugeMetricFamily("posenc_table_cache_entries", "Encoded tables held in the cache.", value=len(cache))


class Metrics:
    """The metric objects of one app, registered in their own `registry` — or, when the values are shared
    between worker processes (`shared_dir`), registered nowhere, and `registry` collects the shared files."""

    def __init__(self, cache_of: Callable[[], Any] | None = None, shared_dir: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.shared_dir = shared_dir
        r: CollectorRegistry | None = self.registry
        if shared_dir is not None:
            r = None
            MultiProcessCollector(self.registry, path=shared_dir)
            pid = os.getpid()
            atexit.register(mark_process_dead, pid, shared_dir)  # this worker's live gauges leave the sums
        self.requests = Counter("posenc_http_requests", "HTTP requests by route template, method and status.",
                                ["route", "method", "status"], registry=r)
        self.latency = Histogram("posenc_http_request_duration_seconds", "HTTP request latency (to the last byte).",
                                 ["route", "method"], buckets=LATENCY_BUCKETS, registry=r)
        self.response_bytes = Counter("posenc_http_response_bytes", "Response body bytes sent, by route template.",
                                      ["route"], registry=r)
        self.in_flight = Gauge("posenc_http_requests_in_flight", "HTTP requests being served now.", registry=r,
                               multiprocess_mode="livesum")
        self.batch_size = Histogram("posenc_batch_size", "Requests per onnxruntime batch.", ["model"],
                                    buckets=BATCH_BUCKETS, registry=r)
        self.queue_depth = Gauge("posenc_queue_depth", "Requests waiting in the model's batcher queue.", ["model"],
                                 registry=r, multiprocess_mode="livesum")
        self.run_seconds = Histogram("posenc_onnxruntime_run_seconds", "Wall time of one onnxruntime session.run.",
                                     ["model"], buckets=RUN_BUCKETS, registry=r)
        self.grpc_requests = Counter("posenc_grpc_requests", "gRPC calls by method and status code.",
                                     ["method", "code"], registry=r)
        self.grpc_latency = Histogram("posenc_grpc_request_duration_seconds", "gRPC call duration (a stream: all "
                                      "of it).", ["method"], buckets=LATENCY_BUCKETS, registry=r)
        self.send_timeouts = Counter("posenc_send_timeouts", "Connections cut because the client stopped reading "
                                     "its response for POSENC_SEND_TIMEOUT.", registry=r)
        info = Gauge("posenc_build_info", "Service version (value is always 1).", ["version"], registry=r,
                     multiprocess_mode="max")
        info.labels(version=__version__).set(1)
        self.shared_cache: SharedCacheMetrics | None = None
        # (route, method, status) → its labelled request counter, latency histogram and byte counter: looked up
        # once (prometheus_client's `labels` takes a lock and builds its key on every call)
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any, Any]] = {}
        if cache_of is not None and r is not None:
            r.register(TableCacheCollector(cache_of))
        elif cache_of is not None:
            self.shared_cache = SharedCacheMetrics(cache_of)

    def observe_batch(self, model: str, size: int) -> None:
        """One batch of `size` requests went to onnxruntime for `model`."""
        self.batch_size.labels(model=model).observe(size)

    def set_queue_depth(self, model: str, depth: int) -> None:
        """`depth` requests are queued for `model` right now."""
        self.queue_depth.labels(model=model).set(depth)

    def observe_run(self, model: str, seconds: float) -> None:
        """One onnxruntime `run` for `model` took `seconds`."""
        self.run_seconds.labels(model=model).observe(seconds)

    def observe_request(self, route: str, method: str, status: int, seconds: float, nbytes: int) -> None:
        children = self._request_children.get((route, method, status))
        if children is None:
            children = (self.requests.labels(route=route, method=method, status=str(status)),
                        self.latency.labels(route=route, method=method), self.response_bytes.labels(route=route))
            self._request_children[route, method, status] = children
        requests, latency, response_bytes = children
        requests.inc()
        latency.observe(seconds)
        response_bytes.inc(nbytes)
        if self.shared_cache is not None:
            self.shared_cache.sync()

    def observe_grpc(self, method: str, code: str, seconds: float) -> None:
        self.grpc_requests.labels(method=method, code=code).inc()
        self.grpc_latency.labels(method=method).observe(seconds)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (version 0.0.4)."""
        if self.shared_cache is not None:
            self.shared_cache.sync()
        return generate_latest(self.registry)


class SharedCacheMetrics:
    """The table cache's numbers as file-backed metrics, for `/metrics` summed over workers.

    Other workers cannot be asked at scrape time, so each copies its cache's counters into shared ones
    after every request (a few attribute reads: the cache itself knows nothing of Prometheus)."""

    def __init__(self, cache_of: Callable[[], Any]) -> None:
        self._cache_of = cache_of
        self._copied = {"hits": 0, "misses": 0}
        self._lock = threading.Lock()  # /metrics syncs from a worker thread, requests from the event loop
        self.hits = Counter("posenc_table_cache_hits", "Table requests answered from the cache.", registry=None)
        self.misses = Counter("posenc_table_cache_misses", "Table requests computed (not in the cache).",
                              registry=None)
        self.gauges = {
            name: Gauge(f"posenc_table_cache_{name}", doc, registry=None, multiprocess_mode="livesum")
            for name, doc in (("bytes", "Bytes of encoded tables held in the caches of all workers."),
                              ("capacity_bytes", "Byte budget of the caches (POSENC_CACHE_BYTES per worker)."),
                              ("entries", "Encoded tables held in the caches of all workers."))}

    def sync(self) -> None:
        cache = self._cache_of()
        if cache is None:
            return
        with self._lock:
            for name, counter in (("hits", self.hits), ("misses", self.misses)):
                now = int(getattr(cache, name))
                if now > self._copied[name]:
                    counter.inc(now - self._copied[name])
                    self._copied[name] = now
        self.gauges["bytes"].set(cache.size_bytes)
        self.gauges["capacity_bytes"].set(cache.capacity)
        self.gauges["entries"].set(len(cache))


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
        if not self.access_log_enabled or not access_log.isEnabledFor(logging.INFO):
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
        # the record itself: `info` would also walk the stack for a caller no format prints
        access_log.handle(access_log.makeRecord(access_log.name, logging.INFO, __file__, 0, ACCESS_MESSAGE,
                                                (method, path, status, duration_ms, nbytes), None, "record",
                                                {"access": fields}))


    def record_grpc(self, method: str, code: str, seconds: float, nbytes: int, peer: str) -> None:
        """One gRPC call (a stream: when it ends; `nbytes`: the responses it wrote): metrics and access log,
        `GRPC /inference.GRPCInferenceService/<method> <code> <ms> <bytes>`."""
        self.metrics.observe_grpc(method, code, seconds)
        if not self.access_log_enabled or not access_log.isEnabledFor(logging.INFO):
            return
        path = f"/inference.GRPCInferenceService/{method}"
        duration_ms = round(seconds * 1000.0, 3)
        fields = {"method": "GRPC", "path": path, "route": path, "grpc_code": code, "duration_ms": duration_ms,
                  "bytes": nbytes, "client": peer}
        access_log.handle(access_log.makeRecord(access_log.name, logging.INFO, __file__, 0, GRPC_ACCESS_MESSAGE,
                                                ("GRPC", path, code, duration_ms, nbytes), None, "record_grpc",
                                                {"access": fields}))


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
    metrics: Metrics = request.app.state.metrics
    return Response(content=metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


_SERVED: list[Metrics] = []  # the metrics of the app this process serves (the last one installed)


def count_send_timeout() -> None:
    """Count one connection the server cut for not reading (called by the protocol, which has no app)."""
    if _SERVED:
        _SERVED[-1].send_timeouts.inc()


def install_metrics(app: FastAPI, access_log_enabled: bool) -> Metrics:
    """Create `app.state.metrics` and `app.state.request_recorder`, add the middleware and the `/metrics` route."""
    metrics = Metrics(cache_of=lambda: getattr(app.state, "table_cache", None), shared_dir=multiprocess_dir())
    app.state.metrics = metrics
    app.state.request_recorder = RequestRecorder(metrics, access_log_enabled)
    _SERVED[:] = [metrics]
    app.add_middleware(ObservabilityMiddleware, recorder=app.state.request_recorder)
    app.include_router(router)
    return metrics
