"""Each kind of work off the event loop (audits, checks, tables) on threads of its own count (`ThreadKinds`), so that
one kind cannot take every thread: 40 audits at once filled anyio's 40 threads and every uncached table waited
behind them. A kind's call beyond its count waits, at most `wait_seconds` and behind at most `waiters` others, then
gets a 503 with Retry-After. The calls run in the request's context (its `work.Work` current) and are counted in
`work.IN_THREADS` while they run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from posenc.service.errors import Unavailable
from posenc.service.request_kit.work import CURRENT, InThread, counted
from posenc.service.settings import Settings, usable_cores

T = TypeVar("T")

# anyio's limiter for the threads of a kind: the kind's own count (`Kind.threads`) already bounds them, this one never
# waits and is not anyio's default (40 tokens shared by every other run_in_threadpool)
_UNBOUNDED = anyio.CapacityLimiter(math.inf)


@dataclass(frozen=True)
class Kind:
    """A kind of work: at most `threads` at once, then at most `waiters` waiting, each for `wait_seconds`."""

    name: str
    threads: int
    waiters: int = 64
    wait_seconds: float = 10.0


class ThreadKinds:
    """The thread counts of each kind of work (`run`)."""

    def __init__(self, kinds: list[Kind]) -> None:
        self.kinds = {kind.name: kind for kind in kinds}
        self._slots = {kind.name: anyio.CapacityLimiter(kind.threads) for kind in kinds}

    def in_use(self, name: str) -> int:
        return int(self._slots[name].borrowed_tokens)

    async def run(self, name: str, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` on a worker thread of kind `name` (in the request's context: its `Work` is current there),
        once one of the kind's threads is free: 503 with Retry-After when `waiters` already wait or none frees up
        within `wait_seconds`."""
        kind, slots = self.kinds[name], self._slots[name]
        # waiters count only where a call would wait: with a thread free, POSENC_MEMORY_WAITERS=0 refuses nothing
        if slots.available_tokens < 1 and slots.statistics().tasks_waiting >= kind.waiters:
            raise _busy(kind, f"{kind.waiters} more wait already")
        borrower = object()
        with anyio.move_on_after(kind.wait_seconds) as waited:
            await slots.acquire_on_behalf_of(borrower)
        if waited.cancelled_caught:
            raise _busy(kind, f"none was free within {kind.wait_seconds:g} s")
        try:
            return await anyio.to_thread.run_sync(counted, InThread(name, CURRENT.get(), time.monotonic()), call,
                                                  *args, limiter=_UNBOUNDED)
        finally:
            slots.release_on_behalf_of(borrower)



AUDIT_WORK, CHECK_WORK, TABLE_WORK = "audits", "checks", "tables"


def thread_kinds(settings: Settings) -> ThreadKinds:
    """The kinds of a server: audits (parsing, judging: CPU-bound, one per core), checks (comparisons of float64
    arrays, two per core) and table computations (whose thread mostly waits for the row-block pool: four per core,
    at least 16); each waits as a request waits for memory (POSENC_MEMORY_WAITERS, POSENC_MEMORY_WAIT_SECONDS)."""
    cores, waiters, wait = usable_cores(), settings.memory_waiters, settings.memory_wait_seconds
    return ThreadKinds([Kind(AUDIT_WORK, max(2, cores), waiters, wait),
                        Kind(CHECK_WORK, max(4, 2 * cores), waiters, wait),
                        Kind(TABLE_WORK, max(16, 4 * cores), waiters, wait)])


def _busy(kind: Kind, why: str) -> Unavailable:
    return Unavailable(f"every thread for {kind.name} is busy ({kind.threads} at once; {why}): retry shortly",
                       retry_after=1, overloaded=True)
