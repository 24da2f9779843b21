"""Process-wide bounds on memory held by requests in flight, and giving freed memory back.

`MemoryBudget`: every table computation, upload and inference request reserves the bytes it will
hold (estimated from its parameters or its Content-Length, before anything is allocated) and gives
them back when its answer is built. Requests that do not fit wait in a bounded line; a full line, or
a wait longer than the limit, is a 503 with Retry-After. So N concurrent large requests hold at most
the budget, not N times their size. A single request larger than the whole budget runs alone.

`release_free_memory`: glibc keeps freed memory of large short-lived arrays in its heaps (and one
heap per thread, up to 8 per core); after large requests the service hands it back to the system
with `malloc_trim`, and `limit_malloc_arenas` caps the heaps at start-up, so the resident size
settles near the cache budget instead of a multiple of it.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from posenc.service.errors import Unavailable

log = logging.getLogger("posenc.budget")

RETRY_AFTER_SECONDS = 1
M_ARENA_MAX = -8  # glibc mallopt parameter (malloc.h)


class MemoryBudget:
    """Bytes reserved by requests in flight, at most `capacity`; waiters in a line of `max_waiters`."""

    def __init__(self, capacity: int, *, max_waiters: int, wait_seconds: float | None,
                 setting: str = "POSENC_MEMORY_BUDGET_BYTES") -> None:
        self.capacity = capacity
        self.max_waiters = max_waiters
        self.wait_seconds = wait_seconds  # None: wait as long as it takes (the queue in front is bounded)
        self.setting = setting  # named in the 503s
        self.reserved = 0
        self.waiting = 0
        self._changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        # created on first use, inside the event loop that serves the requests
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    @asynccontextmanager
    async def reserve(self, nbytes: int, what: str) -> AsyncIterator[None]:
        """Hold `nbytes` (at most the whole budget) while the block runs; 503 when they do not come free."""
        amount = max(0, min(nbytes, self.capacity))
        changed = self._condition()
        async with changed:
            if self.reserved + amount > self.capacity:
                await self._wait(changed, amount, what)
            self.reserved += amount
        try:
            yield
        finally:
            async with changed:
                self.reserved -= amount
                changed.notify_all()

    async def _wait(self, changed: asyncio.Condition, amount: int, what: str) -> None:
        if self.waiting >= self.max_waiters:
            raise Unavailable(f"busy: {self.waiting} requests already wait for memory to compute {what} "
                              f"({self.reserved} of {self.capacity} bytes in use, {self.setting}); "
                              "retry later", retry_after=RETRY_AFTER_SECONDS)
        self.waiting += 1
        try:
            await asyncio.wait_for(changed.wait_for(lambda: self.reserved + amount <= self.capacity),
                                   timeout=self.wait_seconds)
        except TimeoutError:
            raise Unavailable(f"busy: {what} needs {amount} bytes and {self.reserved} of {self.capacity} stayed in "
                              f"use for {self.wait_seconds:g} s ({self.setting}); retry later",
                              retry_after=RETRY_AFTER_SECONDS) from None
        finally:
            self.waiting -= 1


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None  # glibc only


_LIBC = _libc()


def limit_malloc_arenas(arenas: int) -> None:
    """Cap glibc's heaps (one per thread by default): fewer heaps, less memory stranded in them."""
    if _LIBC is not None and arenas > 0:
        _LIBC.mallopt(M_ARENA_MAX, arenas)


def release_free_memory() -> None:
    """Give freed heap memory back to the system (glibc `malloc_trim`); a no-op elsewhere."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
