"""One bounded load generator: N keep-alive connections on loopback, each sending its next request as soon as
the last answer is read in full (closed loop), for a fixed time and/or a fixed count of requests. With
`new_connections`, each client opens a new connection for every request and closes it once the answer is read
(clients without a connection pool), still closed loop.

Every response body is read to its end (Content-Length, chunked, or to the close); statuses and socket
errors are counted. The run is bounded: by `seconds`, by `requests`, and in any case by MAX_SECONDS plus one
request timeout; requests still unanswered then count as hung. A caller that needs each answer (its status,
headers, body, when it was sent) passes `observe`, which may also end a connection's loop.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from posenc.service.testing.http import read_response, request_bytes
from posenc.service.testing.ports import LOOPBACK, require_loopback

MAX_SECONDS = 3600.0
MAX_REQUESTS = 10_000_000
MAX_CONNECTIONS = 1024
RECONNECT_PAUSE = 0.05  # after a failed connect, so a server that is gone is not hammered


@dataclass(frozen=True)
class HttpRequest:
    """One request to send; `label` is the caller's name for it (a kind, a key for its answers)."""

    method: str = "GET"
    path: str = "/"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    label: str = ""

    @cached_property
    def encoded(self) -> bytes:
        return request_bytes(self.method, self.path, self.body, self.headers)


Plan = HttpRequest | Sequence[HttpRequest] | Callable[[int, int], HttpRequest]  # (connection, step) -> request


@dataclass
class Outcome:
    """One request: when it started, when its last byte was sent (None: never fully sent), its answer
    (status None: none came) or the error that ended it."""

    connection: int
    request: HttpRequest
    started: float  # time.monotonic()
    sent_at: float | None = None
    finished: float = 0.0
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None  # only with keep_bodies
    nbytes: int = 0
    error: str | None = None

    @property
    def latency(self) -> float:
        return self.finished - self.started

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


@dataclass
class LoadResult:
    """A run: complete answers, bytes read, errors (non-2xx answers, socket errors, hung requests), its length,
    the median latency of the complete answers, and the count of each status."""

    requests: int
    nbytes: int
    errors: int
    seconds: float
    p50_ms: float
    statuses: Counter[int]
    socket_errors: int = 0
    hung: int = 0

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9


class LoadGenerator:
    """Closed-loop load on `host:port` (loopback only) from `connections` clients, each over one keep-alive
    connection, or over a new connection per request with `new_connections`."""

    def __init__(self, port: int, *, connections: int = 16, seconds: float | None = None,
                 requests: int | None = None, host: str = LOOPBACK, timeout: float = 60.0,
                 keep_bodies: bool = False, new_connections: bool = False) -> None:
        if seconds is None and requests is None:
            raise ValueError("give seconds, requests or both: a load run is bounded")
        if seconds is not None and not 0 < seconds <= MAX_SECONDS:
            raise ValueError(f"seconds must be in (0, {MAX_SECONDS:g}]")
        if requests is not None and not 1 <= requests <= MAX_REQUESTS:
            raise ValueError(f"requests must be in [1, {MAX_REQUESTS}]")
        if not 1 <= connections <= MAX_CONNECTIONS:
            raise ValueError(f"connections must be in [1, {MAX_CONNECTIONS}]")
        self.host, self.port = require_loopback(host), port
        self.connections, self.seconds, self.requests = connections, seconds, requests
        self.timeout, self.keep_bodies, self.new_connections = timeout, keep_bodies, new_connections

    def run(self, plan: Plan, observe: Callable[[Outcome], bool | None] | None = None,
            stop: Callable[[], bool] | None = None) -> LoadResult:
        """Run the load in a fresh event loop (see `run_async`)."""
        return asyncio.run(self.run_async(plan, observe, stop))

    async def run_async(self, plan: Plan, observe: Callable[[Outcome], bool | None] | None = None,
                        stop: Callable[[], bool] | None = None) -> LoadResult:
        """Send `plan` (one request; a list, connection i starting at item i; or a function of (connection,
        step)) until the time or count runs out or `stop()` says so. `observe(outcome)` sees every request;
        returning False ends that connection's loop."""
        run = _Run(self, _plan_function(plan), observe, stop)
        return await run.go()


def _plan_function(plan: Plan) -> Callable[[int, int], HttpRequest]:
    if isinstance(plan, HttpRequest):
        return lambda index, step: plan
    if callable(plan):
        return plan
    items = list(plan)
    if not items:
        raise ValueError("the plan holds no request")
    return lambda index, step: items[(index + step) % len(items)]


class _Run:
    """The state of one run: tickets, running totals, each connection's request in flight."""

    def __init__(self, gen: LoadGenerator, plan: Callable[[int, int], HttpRequest],
                 observe: Callable[[Outcome], bool | None] | None, stop: Callable[[], bool] | None) -> None:
        self.gen, self.plan, self.observe, self.stop = gen, plan, observe, stop
        self.tickets = gen.requests
        self.latencies: list[float] = []
        self.statuses: Counter[int] = Counter()
        self.nbytes = self.socket_errors = self.hung = 0
        self.in_flight: list[Outcome | None] = [None] * gen.connections
        self.deadline = 0.0

    async def go(self) -> LoadResult:
        start = time.monotonic()
        self.deadline = start + (self.gen.seconds if self.gen.seconds is not None else MAX_SECONDS)
        tasks = [asyncio.create_task(self.connection(i)) for i in range(self.gen.connections)]
        _, late = await asyncio.wait(tasks, timeout=self.deadline - start + self.gen.timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in self.in_flight:  # unanswered when the bound ran out
            if outcome is not None:
                self.finish(outcome, "hung: no answer within the run's bound", hung=True)
        elapsed = time.monotonic() - start
        errors = self.socket_errors + self.hung + sum(n for s, n in self.statuses.items() if not 200 <= s < 300)
        p50 = 1000 * statistics.median(self.latencies) if self.latencies else float("nan")
        return LoadResult(len(self.latencies), self.nbytes, errors, elapsed, p50, self.statuses, self.socket_errors,
                          self.hung)

    def more(self) -> bool:
        if (self.stop is not None and self.stop()) or time.monotonic() >= self.deadline:
            return False
        if self.tickets is not None:
            if self.tickets <= 0:
                return False
            self.tickets -= 1
        return True

    def finish(self, outcome: Outcome, error: str | None = None, *, hung: bool = False) -> bool | None:
        """Count one request (answered, failed, or hung) and show it to `observe`."""
        outcome.finished, outcome.error = time.monotonic(), error
        if hung:
            self.hung += 1
        elif error is not None:
            self.socket_errors += 1
        else:
            self.latencies.append(outcome.latency)
            self.statuses[outcome.status or 0] += 1
            self.nbytes += outcome.nbytes
        return self.observe(outcome) if self.observe is not None else None

    async def connection(self, index: int) -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        step = 0
        try:
            while self.more():
                request = self.plan(index, step)
                step += 1
                outcome = self.in_flight[index] = Outcome(index, request, time.monotonic())
                connected = conn is not None
                try:
                    async with asyncio.timeout(self.gen.timeout):
                        if conn is None:
                            conn = await self.connect()
                            connected = True
                        conn[1].write(request.encoded)
                        await conn[1].drain()
                        outcome.sent_at = time.monotonic()
                        outcome.status, outcome.headers, outcome.body, outcome.nbytes = await read_response(
                            conn[0], self.gen.keep_bodies)
                except (OSError, EOFError, TimeoutError, ValueError, IndexError, asyncio.LimitOverrunError) as exc:
                    self.in_flight[index] = None
                    _close(conn)
                    conn = None
                    if self.finish(outcome, f"{type(exc).__name__}: {exc}".rstrip(": ")) is False:
                        return
                    if not connected:
                        await asyncio.sleep(RECONNECT_PAUSE)
                    continue
                self.in_flight[index] = None
                if self.gen.new_connections or outcome.headers.get("connection", "").lower() == "close":
                    _close(conn)
                    conn = None
                if self.finish(outcome) is False:
                    return
        finally:
            _close(conn)

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(self.gen.host, self.gen.port, limit=1 << 20)
        writer.transport.set_write_buffer_limits(0)  # drain() returns once every byte is in the kernel
        return reader, writer


def _close(conn: tuple[Any, asyncio.StreamWriter] | None) -> None:
    if conn is not None:
        conn[1].close()
