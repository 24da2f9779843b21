"""The process's Prometheus metrics (`GET /metrics` over HTTP exposes them) and its access log, for both transports.

Every process object (`posenc.service.process.ServiceProcess`) gets its own `CollectorRegistry` (never the
process-global default one), so several in one process — tests, `posenc table` — do not collide.

What the rest of the service reports (the engine's batchers, through
`posenc.service.inference.runtime.batcher.BatchObserver`; the process hands them its `Metrics`):

- `metrics.observe_batch(model, size)`: one onnxruntime batch of `size` requests was formed.
- `metrics.set_queue_depth(model, n)`: `n` requests are waiting in the model's batcher queue now.
- `metrics.observe_run(model, seconds)`: one `session.run` took `seconds` of wall time.

Each transport records its calls: HTTP per route *template* (`/v2/models/{name}/infer`, not the raw path, so that
cardinality stays bounded; `posenc.service.http.metrics`), gRPC per method and status code
(`posenc.service.grpc.server.grpc_recorder`). The table cache's hits, misses and bytes are read from the cache at
scrape time.

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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from posenc.service import __version__

access_log = logging.getLogger("posenc.access")  # docs/operations.md documents this name: logs filter on it
ACCESS_MESSAGE = "%s %s %d %.1fms %dB"  # method, path, status, duration, response bytes

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
RUN_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
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
        # Each inference's server-side time by phase (`posenc.service.request_kit.phases`), as Triton exports its
        # own (`nv_inference_request_duration_us`, `nv_inference_queue_duration_us`, ...): cumulative microseconds
        # beside a count, so that a rate of one over the other is the mean, and a histogram per phase
        self.inferences = Counter("posenc_inference_requests", "Inferences answered, by model and protocol.",
                                  ["model", "protocol"], registry=r)
        self.inference_us = Counter("posenc_inference_request_duration_us", "Cumulative server-side time of the "
                                    "inferences answered, from the request's head to the answer made (us).",
                                    ["model", "protocol"], registry=r)
        self.phase_us = Counter("posenc_inference_phase_duration_us", "Cumulative server-side time of the "
                                "inferences answered, by phase: route, admit, read, parse, queue, run, encode (us).",
                                ["model", "protocol", "phase"], registry=r)
        self.phase_seconds = Histogram("posenc_inference_phase_seconds", "Server-side time of one inference's phase.",
                                       ["protocol", "phase"], buckets=RUN_BUCKETS, registry=r)
        self._phase_children: dict[tuple[str, str, str], tuple[Any, Any]] = {}
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

    def observe_phases(self, model: str, protocol: str, spans: Mapping[str, float], total: float) -> None:
        """One inference answered: its phases' seconds (`spans`) and its `total`."""
        self.inferences.labels(model=model, protocol=protocol).inc()
        self.inference_us.labels(model=model, protocol=protocol).inc(total * 1e6)
        for phase, seconds in spans.items():
            children = self._phase_children.get((model, protocol, phase))
            if children is None:
                children = (self.phase_us.labels(model=model, protocol=protocol, phase=phase),
                            self.phase_seconds.labels(protocol=protocol, phase=phase))
                self._phase_children[model, protocol, phase] = children
            children[0].inc(seconds * 1e6)
            children[1].observe(seconds)

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


def access_logging(enabled: bool) -> bool:
    """Whether an access-log record is wanted now (`enabled`: POSENC_ACCESS_LOG)."""
    return enabled and access_log.isEnabledFor(logging.INFO)


def log_access(message: str, args: tuple[Any, ...], fields: dict[str, Any], caller: str) -> None:
    """One access-log record (`fields` under `access`, which the JSON formatter writes out): built directly, since
    `info` would also walk the stack for a caller no format prints."""
    access_log.handle(access_log.makeRecord(access_log.name, logging.INFO, __file__, 0, message, args, None, caller,
                                            {"access": fields}))
