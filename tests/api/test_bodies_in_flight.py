"""Reservations held past their block (`MemoryBudget.acquire`), and response bodies counted in the budget
until they are sent (`BodiesInFlight`, `HeldResponse`); the protocol's side is tests/server/test_held_bodies.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc

from fastapi.testclient import TestClient

from posenc.service.budget import BodiesInFlight, MemoryBudget
from posenc.service.http.app import create_app
from posenc.service.request_kit.sending import HeldResponse
from posenc.service.settings import Settings

BIG = bytes(1 << 20)


def test_a_reservation_shrinks_and_releases_once() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=1, wait_seconds=5)
        reservation = await budget.acquire(80, "a test")
        reservation.shrink(30)
        assert budget.reserved == 30
        reservation.shrink(50)  # never grows
        assert budget.reserved == 30
        reservation.release()
        reservation.release()
        assert budget.reserved == 0

    asyncio.run(scenario())


def test_a_synchronous_release_wakes_a_waiter() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=1, wait_seconds=5)
        held = await budget.acquire(100, "a test")
        waiter = asyncio.create_task(budget.acquire(60, "the next"))
        await asyncio.sleep(0.01)
        assert budget.waiting == 1 and budget.try_acquire(1) is None  # nobody jumps the line
        asyncio.get_running_loop().call_soon(held.release)  # as a transport callback would
        (await asyncio.wait_for(waiter, 1)).release()
        assert budget.reserved == 0 and budget.waiting == 0

    asyncio.run(scenario())


def test_a_body_is_counted_once_however_many_send_it() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(4 << 20, max_waiters=1, wait_seconds=5)
        bodies = BodiesInFlight(budget)
        first = bodies.adopt(BIG, await budget.acquire(3 << 20, "a table"))  # 3 MiB to compute, 1 MiB sent
        assert budget.reserved == 1 << 20
        shared = [bodies.try_share(BIG) for _ in range(5)]
        assert budget.reserved == 1 << 20 and bodies.bytes_held == 1 << 20
        first()
        first()  # idempotent: the other senders still hold it
        for release in shared[:-1]:
            assert release is not None
            release()
        assert budget.reserved == 1 << 20
        last = shared[-1]
        assert last is not None
        last()
        assert budget.reserved == 0 and bodies.bytes_held == 0

    asyncio.run(scenario())


def test_small_bodies_are_not_counted_and_a_body_that_does_not_fit_waits() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(3 << 20, max_waiters=1, wait_seconds=0.05)
        bodies = BodiesInFlight(budget)
        bodies.adopt(b"x" * 100, await budget.acquire(1000, "a small table"))()
        assert budget.reserved == 0
        hold = await budget.acquire(5 << 20, "everything")  # at most the whole budget
        assert bodies.try_share(b"y" * 100) is not None
        assert bodies.try_share(BIG) is None
        waiting = asyncio.create_task(bodies.share(BIG, "a cached table"))
        await asyncio.sleep(0.01)
        hold.release()
        (await waiting)()
        assert budget.reserved == 0

    asyncio.run(scenario())


def test_a_body_of_the_small_bound_is_counted_and_one_byte_less_is_not() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(1 << 20, max_waiters=1, wait_seconds=5)
        bodies = BodiesInFlight(budget, small_bytes=1000)
        small, bound = b"s" * 999, b"b" * 1000
        send_small = bodies.adopt(small, await budget.acquire(5000, "a small table"))
        assert budget.reserved == 0 and bodies.bytes_held == 0  # all given back before it is sent
        send_bound = bodies.adopt(bound, await budget.acquire(5000, "a table"))
        assert budget.reserved == 1000 == bodies.bytes_held  # the body's share, while it is sent
        send_small()
        send_bound()
        assert budget.reserved == 0
        shares = bodies.try_share(small), bodies.try_share(bound)
        assert budget.reserved == 1000
        for release in shares:
            assert release is not None
            release()
        assert budget.reserved == 0

    asyncio.run(scenario())


def test_a_held_response_releases_when_sent_or_dropped() -> None:
    released: list[str] = []
    HeldResponse(BIG, release=lambda: released.append("dropped"))
    gc.collect()
    assert released == ["dropped"]

    app = create_app(Settings(memory_budget_bytes=64 << 20, cache_bytes=0))
    with TestClient(app) as client:  # no protocol hook: released once the response was passed on
        response = client.get("/v1/alibi/bias?num_heads=16&query_length=256&key_length=256&format=raw")
        assert response.status_code == 200 and len(response.content) == 4 << 20
        assert app.state.process.memory_budget.reserved == 0 and app.state.process.bodies_in_flight.bytes_held == 0


def test_a_send_that_raises_or_is_cancelled_gives_its_bytes_back() -> None:
    """Without the protocol's hook (a test client), the release runs after the send, whatever ends it."""
    released: list[str] = []

    async def failing_send(message: object) -> None:
        raise ConnectionResetError

    async def stalled_send(message: object) -> None:
        await asyncio.sleep(60)

    async def scenario() -> None:
        raising = HeldResponse(BIG, release=lambda: released.append("raised"))
        with contextlib.suppress(ConnectionResetError):
            await raising({"type": "http"}, None, failing_send)  # type: ignore[arg-type]
        stalled = HeldResponse(BIG, release=lambda: released.append("cancelled"))
        task = asyncio.create_task(stalled({"type": "http"}, None, stalled_send))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert released == ["raised", "cancelled"]
