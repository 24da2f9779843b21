"""Process-wide bounds on memory held by requests in flight, and giving freed memory back.

`MemoryBudget`: every table computation, upload and inference request reserves the bytes it will
hold (estimated from its parameters or its Content-Length, before anything is allocated) and gives
them back when its answer is built. Requests that do not fit wait in a bounded line; a full line, or
a wait longer than the limit, is a 503 with Retry-After. So N concurrent large requests hold at most
the budget, not N times their size. A single request larger than the whole budget runs alone.

A reservation can be lent (`Reservation.lend`): what a gRPC message may bring in while it has not arrived yet, held
in case it comes but given to whoever waits for memory once the holder has had its time (`MemoryBudget._reclaim`): a
call that sends nothing holds nothing another request needs.

`release_free_memory`: glibc keeps freed memory of large short-lived arrays in its heaps (and one
heap per thread, up to 8 per core); after large requests the service hands it back to the system
with `malloc_trim`, and `configure_malloc` caps the heaps at start-up, so the resident size
settles near the cache budget instead of a multiple of it. It also stops glibc from handing
back, on every `free`, what the next allocation asks for again: a table computed in row blocks
allocates and frees the same few MiB of temporaries per block, and with glibc's defaults each block
paid for its pages again (a third of its time in page faults).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from posenc.service.errors import Unavailable
from posenc.service.settings import Settings

log = logging.getLogger("posenc.budget")

RETRY_AFTER_SECONDS = 1
# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit (HEAP_MAX_SIZE / 2)
# The process with its models loaded and its threads started, beside what the settings bound: Python, numpy,
# onnxruntime, the shipped models' sessions (measured 129 MiB idle on 2 cores), with room for the stacks of the
# worker threads and the event loop's buffers.
BASE_BYTES = 256 * 1024 * 1024
# After a request that held this much (a table's working set, a gRPC message received), freed heap memory is handed
# back (`release_free_memory`): below it, what glibc keeps is reused by the next request of its kind.
RELEASE_AFTER_BYTES = 16 << 20
# 1/UNLENT_SHARE of a budget is never lent (`Reservation.lend`), unless a lent reservation is alone: a request that
# holds its memory finds that much free at once however many lent reservations wait for what may never come.
UNLENT_SHARE = 8


def memory_bound(settings: Settings) -> int:
    """The peak resident size the settings bound (docs/operations.md "Memory"): the memory budget (every request's
    working set and a calibration child's), the table cache, what glibc's heaps may keep, and the base. The
    deployment manifests' memory requests are this figure (tests/deploy checks them)."""
    kept = settings.malloc_arenas * settings.malloc_keep_bytes
    return settings.memory_budget_bytes + settings.cache_bytes + kept + BASE_BYTES


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
        # one future per waiter, woken (all of them: each checks whether it fits now) when bytes come back
        self._wakeups: list[asyncio.Future[None]] = []
        # the waiters in the line that hold part of their memory already (growing), by arrival: bytes held
        self._growing: dict[int, int] = {}
        self._arrivals = 0
        self._lent: dict[Reservation, None] = {}  # reservations a waiter may take back (`Reservation.lend`)
        self.lent_bytes = 0  # what they hold
        # waiters for a reservation that will not be lent, by arrival: they take lent bytes back before the waiters
        # for one to be lent that came after them
        self._keeping: set[int] = set()

    @asynccontextmanager
    async def reserve(self, nbytes: int, what: str) -> AsyncIterator[None]:
        """Hold `nbytes` (at most the whole budget) while the block runs; 503 when they do not come free."""
        reservation = await self.acquire(nbytes, what)
        try:
            yield
        finally:
            reservation.release()

    async def acquire(self, nbytes: int, what: str, *, line: bool = True, holding: int = 0,
                      lent: bool = False) -> Reservation:
        """Hold `nbytes` (at most the whole budget) until the reservation is released; 503 when they do not
        come free in time. `line=False`: the wait is not counted in `max_waiters` (the caller's own limit bounds
        how many wait: gRPC's calls in progress). `holding`: what the caller holds already (`Reservation.grow`).
        `lent`: the reservation will be lent (`Reservation.lend`); while a request for memory of its own waits,
        this one does not take lent bytes back: they go to that request first, so lent memory does not pass from
        one holder that may never use it to the next."""
        amount = self._amount(nbytes)
        if not self._fits(amount, lent):
            await self._wait(amount, what, line, holding, lent)
        self.reserved += amount
        return Reservation(self, amount)

    @asynccontextmanager
    async def hold(self, nbytes: int, what: str) -> AsyncIterator[None]:
        """Hold `nbytes` while the block runs, waiting as long as it takes (the server's own work, such as a
        calibration child, which must count in the bound but must not fail because clients filled the budget)."""
        while True:
            try:
                reservation = await self.acquire(nbytes, what)
                break
            except Unavailable:
                await asyncio.sleep(RETRY_AFTER_SECONDS)
        try:
            yield
        finally:
            reservation.release()

    def try_acquire(self, nbytes: int) -> Reservation | None:
        """Hold `nbytes` if they are free now and nobody waits for memory; else None (no waiting)."""
        amount = self._amount(nbytes)
        if self.waiting or self.reserved + amount > self.capacity:
            return None
        self.reserved += amount
        return Reservation(self, amount)

    def _amount(self, nbytes: int) -> int:
        return max(0, min(nbytes, self.capacity))

    def _fits(self, amount: int, lent: bool = False) -> bool:
        """Whether `amount` fits now (`lent`: within the share that may be lent too, `UNLENT_SHARE`)."""
        return self._room(self.reserved, self.lent_bytes, amount, lent)

    def _room(self, reserved: int, lent_bytes: int, amount: int, lent: bool) -> bool:
        if reserved + amount > self.capacity:
            return False
        return not lent or not lent_bytes or lent_bytes + amount <= self.capacity - self.capacity // UNLENT_SHARE

    def _reclaim(self, amount: int, now: float, lent: bool, arrival: int | None = None) -> bool:
        """Take back lent reservations whose time has come, those lent the longest first, when that makes `amount`
        fit: each holder is told (its `reclaim` ends what could fill them) and its bytes are counted as free at
        once, for the waiter that asked (`lent`: one whose reservation will be lent too, which leaves them to the
        others that came before it, `arrival`: its place; None: it comes last). Whether `amount` fits now."""
        if lent and self._keeping and (arrival is None or min(self._keeping) < arrival):
            return False
        due = sorted((r for r in self._lent if r.lent_from is not None and r.lent_from <= now),
                     key=lambda r: r.lent_from or 0.0)
        reserved, lent_bytes, taken = self.reserved, self.lent_bytes, 0
        while not self._room(reserved, lent_bytes, amount, lent):
            if taken == len(due):
                return False
            reserved -= due[taken].amount
            lent_bytes -= due[taken].amount
            taken += 1
        for reservation in due[:taken]:
            reservation.take_back()
        if self.capacity - self.reserved > amount:
            self._wake()  # what is left over may fit another waiter
        return True

    def _next_due(self, now: float) -> float | None:
        """When the next lent reservation not yet due may be taken back (None: none)."""
        return min((r.lent_from for r in self._lent if r.lent_from is not None and r.lent_from > now), default=None)

    def _stuck(self, arrival: int) -> bool:
        """Whether the waiter that arrived `arrival`-th must give up now: every byte reserved is held by waiters that
        want more (no request will give any back), and it is the latest of those to arrive."""
        growing = self._growing
        return bool(growing) and arrival == max(growing) and sum(growing.values()) >= self.reserved

    def _give_back(self, amount: int) -> None:
        """Return `amount` bytes (synchronous: transport callbacks release too) and wake the waiters."""
        self.reserved -= amount
        self._wake()

    def _wake(self) -> None:
        wakeups, self._wakeups = self._wakeups, []
        for wakeup in wakeups:
            if not wakeup.done():
                wakeup.set_result(None)

    async def _wait(self, amount: int, what: str, line: bool = True, holding: int = 0, lent: bool = False) -> None:
        if self._reclaim(amount, time.monotonic(), lent):
            return
        if line and self.waiting >= self.max_waiters:
            raise Unavailable(f"busy: {self.waiting} requests already wait for memory to compute {what} "
                              f"({self.reserved} of {self.capacity} bytes in use, {self.setting}); "
                              "retry later", retry_after=RETRY_AFTER_SECONDS, overloaded=True)
        self.waiting += line
        arrival = self._arrivals = self._arrivals + 1
        if not lent:
            self._keeping.add(arrival)
        if line and holding:
            self._growing[arrival] = holding
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.wait_seconds):
                while not self._fits(amount, lent):
                    if self._reclaim(amount, time.monotonic(), lent, arrival):
                        break
                    if self._stuck(arrival):
                        raise Unavailable(f"busy: {what} needs {amount} bytes more while every request that holds "
                                          f"memory waits for more ({self.reserved} of {self.capacity} bytes, "
                                          f"{self.setting}); retry later", retry_after=RETRY_AFTER_SECONDS,
                                          overloaded=True)
                    wakeup = loop.create_future()
                    self._wakeups.append(wakeup)
                    now = time.monotonic()
                    due = self._next_due(now)  # a lent reservation that comes due wakes the waiter too
                    timer = None if due is None else loop.call_at(loop.time() + due - now, _resolve, wakeup)
                    try:
                        await wakeup
                    finally:
                        if timer is not None:
                            timer.cancel()
        except TimeoutError:
            raise Unavailable(f"busy: {what} needs {amount} bytes and {self.reserved} of {self.capacity} stayed in "
                              f"use for {self.wait_seconds:g} s ({self.setting}); retry later",
                              retry_after=RETRY_AFTER_SECONDS, overloaded=True) from None
        finally:
            self.waiting -= line
            self._keeping.discard(arrival)
            if not lent:
                self._wake()  # the waiters for a reservation to be lent that came after it may take lent bytes
            if self._growing.pop(arrival, None) is not None:
                self._wake()  # the next to grow checks whether it is stuck now


class Reservation:
    """Bytes held in a `MemoryBudget` until `release()` (idempotent); `shrink` gives back what is not needed; `lend`
    lets waiters take them back."""

    def __init__(self, budget: MemoryBudget, amount: int) -> None:
        self.budget = budget
        self.amount = amount
        self.reclaim: Callable[[], None] | None = None  # set while lent: tells the holder its bytes were taken
        self.lent_from: float | None = None  # time.monotonic() from which a waiter may take them (None: not yet)

    def lend(self, reclaim: Callable[[], None], after: float | None) -> None:
        """Lend the reservation: from `after` seconds on (None: not until `lend` is called again with a time), a
        request that waits for memory may take it back. Then `reclaim()` is called, synchronously, once: the holder
        must stop whatever could fill these bytes, which are no longer its own. For memory held in case something
        arrives (a gRPC message asked for), given back by whoever has waited for it long enough to show it is not
        coming."""
        self.reclaim = reclaim
        self.lent_from = None if after is None else time.monotonic() + after
        budget = self.budget
        if self not in budget._lent:
            budget._lent[self] = None
            budget.lent_bytes += self.amount
        budget._wake()  # waiters set their timers to the new time

    def keep(self) -> None:
        """Lend no more: what was held in case it came has come (or will not be asked for)."""
        budget = self.budget
        if self in budget._lent:
            del budget._lent[self]
            budget.lent_bytes -= self.amount
            budget._wake()  # the share that may be lent has room again
        self.reclaim = self.lent_from = None

    def take_back(self) -> None:
        """The budget takes the lent bytes back: counted as free, the holder told."""
        reclaim = self.reclaim
        self.keep()
        self.budget.reserved -= self.amount
        self.amount = 0
        if reclaim is not None:
            reclaim()

    def shrink(self, nbytes: int) -> None:
        """Keep at most `nbytes` of the reservation; give back the rest."""
        keep = max(0, min(nbytes, self.amount))
        if keep < self.amount:
            self.budget._give_back(self.amount - keep)
            self.amount = keep

    def release(self) -> None:
        self.keep()
        self.shrink(0)

    async def grow(self, nbytes: int, what: str) -> None:
        """Hold `nbytes` in all (at most the whole budget), waiting for the difference as `acquire` does. When every
        request that holds memory waits to grow, none would give any back: the latest to wait gets the 503 at once
        (before, the wait's time limit ended it)."""
        more = min(nbytes, self.budget.capacity) - self.amount
        if more > 0:
            self.amount += (await self.budget.acquire(more, what, holding=self.amount)).amount


# A response body under this size is not held in the budget while it is sent: the socket's kernel buffer
# takes most of it at once, and a connection holds at most one response at a time (uvicorn writes the next
# only when the transport has room), so what such bodies hold is at most this much per connection.
SMALL_BODY_BYTES = 64 * 1024


class BodiesInFlight:
    """Response bodies on their way to the kernel, each counted once in `budget` until every response that
    sends it has handed its last byte to the kernel (or lost its connection).

    A body is identified by its object: a table body shared by the cache and by many responses (the same
    `bytes`) is counted once, whatever the number of clients it goes to, and stays counted while any of them
    still sends it, even after the cache evicted it. While the cache also holds it, it is counted twice (in
    the cache budget and here): an upper bound, never less than what is held. Bodies under
    `SMALL_BODY_BYTES` are not counted.
    """

    def __init__(self, budget: MemoryBudget, small_bytes: int = SMALL_BODY_BYTES) -> None:
        self.budget = budget
        self.small_bytes = small_bytes
        self._held: dict[int, _HeldBody] = {}  # id(body) -> the body (kept alive: its id stays unique), senders

    def adopt(self, body: bytes, reservation: Reservation) -> Callable[[], None]:
        """Hand `body`'s share of `reservation` (made to compute it) over to its sending; the rest goes back.
        Returns the release for the one response that sends it."""
        held = self._held.get(id(body))
        if held is not None or len(body) < self.small_bytes:
            reservation.release()
            return held.join() if held is not None else _nothing
        reservation.shrink(len(body))
        return self._hold(body, reservation)

    def try_share(self, body: bytes) -> Callable[[], None] | None:
        """The release for one more response sending `body`: free if it is small or already counted; else
        its bytes reserved now, or None when they do not fit without waiting."""
        held = self._held.get(id(body))
        if held is not None:
            return held.join()
        if len(body) < self.small_bytes:
            return _nothing
        reservation = self.budget.try_acquire(len(body))
        return None if reservation is None else self._hold(body, reservation)

    async def share(self, body: bytes, what: str) -> Callable[[], None]:
        """As `try_share`, waiting for the bytes (or a 503, as `MemoryBudget.acquire`) when they do not fit."""
        release = self.try_share(body)
        if release is not None:
            return release
        reservation = await self.budget.acquire(len(body), what)
        held = self._held.get(id(body))  # another response may have started sending it meanwhile
        if held is not None:
            reservation.release()
            return held.join()
        return self._hold(body, reservation)

    @property
    def bytes_held(self) -> int:
        return sum(held.reservation.amount for held in self._held.values())

    def _hold(self, body: bytes, reservation: Reservation) -> Callable[[], None]:
        held = _HeldBody(body, reservation, lambda: self._held.pop(id(body), None))
        self._held[id(body)] = held
        return held.join()


class _HeldBody:
    def __init__(self, body: bytes, reservation: Reservation, forget: Callable[[], object]) -> None:
        self.body = body
        self.reservation = reservation
        self.forget = forget
        self.senders = 0

    def join(self) -> Callable[[], None]:
        """One more sender; its release (idempotent) gives the bytes back after the last sender's."""
        self.senders += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self.senders -= 1
            if self.senders == 0:
                self.forget()
                self.reservation.release()

        return release


def _nothing() -> None:
    """The release of a body that holds nothing in the budget."""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None  # glibc only


_LIBC = _libc()


def configure_malloc(arenas: int, keep_bytes: int) -> None:
    """glibc's heaps, set once at start-up; a no-op elsewhere, and each part 0 leaves glibc's default.

    `arenas` caps the heaps (one per thread by default, up to 8 per core): fewer heaps, less memory stranded
    in them. `keep_bytes` lets each heap keep that much freed memory at its top for the next allocation
    (M_TRIM_THRESHOLD) and serves allocations below half of it (at most 32 MiB) from the heaps rather than
    mapping and unmapping each (M_MMAP_THRESHOLD). Setting either ends glibc's own adjustment of both, whose
    trim threshold (twice the largest block freed so far) is below a row block's temporaries. The memory
    kept is bounded by `arenas` times `keep_bytes`, and `release_free_memory` hands it back after large
    requests."""
    if _LIBC is None:
        return
    if arenas > 0:
        _LIBC.mallopt(M_ARENA_MAX, arenas)
    if keep_bytes > 0:
        _LIBC.mallopt(M_MMAP_THRESHOLD, min(keep_bytes // 2, MAX_MMAP_THRESHOLD))
        _LIBC.mallopt(M_TRIM_THRESHOLD, keep_bytes)


def release_free_memory() -> None:
    """Give freed heap memory back to the system (glibc `malloc_trim`); a no-op elsewhere."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def kept_bound(arenas: int, keep_bytes: int) -> int:
    """The freed memory glibc's heaps may keep by `configure_malloc`'s settings: `arenas` x `keep_bytes` (0: no
    bound known, glibc's defaults)."""
    return arenas * keep_bytes if arenas > 0 and keep_bytes > 0 else 0


def heap_free_bytes() -> int | None:
    """Freed bytes glibc's heaps hold now (`mallinfo2`: its free chunks, every heap), None where unknown."""
    mallinfo2 = getattr(_LIBC, "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.fordblks + info.fsmblks)


def holds_more_free_than(bound: int) -> bool:
    """Whether the heaps hold more freed memory than `bound` (true where that cannot be known, or with no bound):
    `malloc_trim` walks every heap and the pages it hands back are faulted in again by the next large
    allocation (a 25 MB gRPC message: 20-30 ms a message, trimmed each time), so it runs only past what the heaps
    may keep anyway."""
    free = heap_free_bytes()
    return bound <= 0 or free is None or free > bound
