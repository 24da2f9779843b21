"""A request's work off the event loop: stopped when its client leaves, named at shutdown (the kinds' threads:
`posenc.service.request_kit.threads`).

* `Work`: one request's cancellation flag and name (`POST /v1/audit`). posenc's server
  (`posenc.service.http.protocol`) makes one per request and sets it when the connection goes before the answer was
  sent: the client left, or a timer (body, send, POSENC_GRACEFUL_SHUTDOWN_TIMEOUT) cut it. A request's CPU-bound work
  calls `check()` between its steps (a table's row blocks, the audit's stages) and stops with a 499 at the first
  one after the flag is set, so a computation nobody waits for no longer holds a thread and a core to its end.
* `CURRENT`: the flag of the request being served (set by the app from the scope, `serving`); worker threads
  started through anyio (`run_in_threadpool`, `threads.ThreadKinds.run`) run in a copy of the request's context
  and see it, a pool of its own (the row blocks') is handed it.
* `RUNNING`, `IN_THREADS`: the requests of this process whose handler has not returned, and the calls running on
  the kinds' threads (which outlive a cancelled handler), for a shutdown that must not wait for them and names them
  in its WARNING (`posenc.service.serving.server`).

Light on purpose: `posenc audit FILE` and `posenc table` check the flag (none is set there) without importing the web
stack.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

from posenc.service.errors import ClientClosedRequest

WORK_SCOPE = "posenc.work"  # ASGI scope key: the request's `Work` (posenc's server sets it; absent under others)
T = TypeVar("T")


class WorkCancelled(ClientClosedRequest):
    """The request's work stopped at a check because its connection is gone (a 499 nobody receives)."""


class Work:
    """One request's cancellation flag (a `threading.Event`: worker threads read it) and its name."""

    __slots__ = ("_flag", "label", "reason", "started")

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()
        self.reason: str | None = None
        self._flag = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._flag.is_set()

    def cancel(self, reason: str) -> None:
        """Stop this request's work at its next check; the first reason given is kept."""
        if self.reason is None:
            self.reason = reason
        self._flag.set()

    def check(self) -> None:
        """Raise `WorkCancelled` when the flag is set."""
        if self._flag.is_set():
            raise WorkCancelled(f"{self.label}: stopped, {self.reason}")

    def describe(self) -> str:
        state = f"cancelled ({self.reason})" if self.reason is not None else "running"
        return f"{self.label} ({time.monotonic() - self.started:.1f} s, {state})"


CURRENT: ContextVar[Work | None] = ContextVar("posenc_work", default=None)
RUNNING: set[Work] = set()


@dataclass(eq=False)
class InThread:
    """A call of `threads.ThreadKinds.run` on its thread: a task's cancellation does not reach it, so a shutdown counts
    these, not the tasks that wait for them."""

    kind: str
    work: Work | None
    started: float

    def describe(self) -> str:
        what = self.work.describe() if self.work is not None else f"a call ({time.monotonic() - self.started:.1f} s)"
        return f"{self.kind}: {what}"


IN_THREADS: set[InThread] = set()


def current() -> Work | None:
    return CURRENT.get()


def check() -> None:
    """Stop here (`WorkCancelled`) if the current request's connection is gone; nothing outside a request."""
    work = CURRENT.get()
    if work is not None:
        work.check()


@contextmanager
def serving(work: Work | None) -> Iterator[None]:
    """`work` current (and in RUNNING) while a request's handler runs."""
    if work is None:
        yield
        return
    token = CURRENT.set(work)
    RUNNING.add(work)
    try:
        yield
    finally:
        RUNNING.discard(work)
        CURRENT.reset(token)


def running() -> list[str]:
    """What still runs, oldest first (for a log line): the calls on the kinds' threads, then the requests whose
    handler has not returned."""
    threads = sorted(IN_THREADS, key=lambda call: call.started)
    named = {call.work for call in threads}
    return [call.describe() for call in threads] + \
        [work.describe() for work in sorted(RUNNING - named, key=lambda work: work.started)]


def counted(entry: InThread, call: Callable[..., T], *args: Any) -> T:
    """`call(*args)` on the calling thread, in IN_THREADS meanwhile."""
    IN_THREADS.add(entry)
    try:
        return call(*args)
    finally:
        IN_THREADS.discard(entry)
