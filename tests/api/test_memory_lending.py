"""Lent reservations (`Reservation.lend`, issue 62): memory held for what may arrive (a gRPC message asked for)
goes to a request that waits for memory once its time has come, never before; a budget keeps a share that is
never lent; and lent memory taken back goes to requests that hold their memory before it goes to the next lender."""

from __future__ import annotations

import asyncio

from posenc.service.budget import UNLENT_SHARE, MemoryBudget, Reservation


async def _lent(budget: MemoryBudget, nbytes: int, after: float | None, taken: list[str], name: str) -> Reservation:
    reservation = await budget.acquire(nbytes, name, lent=True)
    reservation.lend(lambda: taken.append(name), after)
    return reservation


def test_a_lent_reservation_goes_to_a_waiter_once_its_time_has_come() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=8, wait_seconds=None)
        taken: list[str] = []
        silent = await _lent(budget, 80, 0.3, taken, "silent")
        waiter = asyncio.ensure_future(budget.acquire(50, "a table"))
        await asyncio.sleep(0.1)
        assert not waiter.done() and taken == []  # not yet: the message may still come
        held = await asyncio.wait_for(waiter, 10)
        assert taken == ["silent"] and silent.amount == 0 and held.amount == 50
        assert budget.reserved == 50 and budget.lent_bytes == 0
        silent.release()  # the holder's own release gives nothing back twice
        held.release()
        assert budget.reserved == 0

    asyncio.run(scenario())


def test_a_lent_reservation_nobody_needs_stays_and_one_kept_is_never_taken() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(200, max_waiters=8, wait_seconds=0.2)
        taken: list[str] = []
        silent = await _lent(budget, 40, 0.0, taken, "silent")
        arrived = await _lent(budget, 50, 0.0, taken, "arrived")
        arrived.keep()  # its message came: its bytes are its own
        await asyncio.sleep(0.05)
        assert taken == [] and budget.reserved == 90  # due, but nobody waits
        large = await budget.acquire(150, "a table")  # 110 free: takes the lent one back, not the kept one
        assert taken == ["silent"] and arrived.amount == 50 and budget.reserved == 200
        large.release()
        arrived.release()
        silent.release()
        assert budget.reserved == 0

    asyncio.run(scenario())


def test_a_share_of_the_budget_is_never_lent() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(160, max_waiters=8, wait_seconds=None)
        share = budget.capacity - budget.capacity // UNLENT_SHARE  # 140
        taken: list[str] = []
        lent = [await _lent(budget, 20, None, taken, f"read {i}") for i in range(share // 20)]
        one_more = asyncio.ensure_future(budget.acquire(20, "one more read", lent=True))
        await asyncio.sleep(0.05)
        assert not one_more.done() and budget.lent_bytes == share and budget.reserved == share
        table = await asyncio.wait_for(budget.acquire(20, "a table"), 1)  # at once: the share never lent
        table.release()
        await asyncio.sleep(0.05)
        assert not one_more.done()  # 20 free, but not to be lent
        lent[0].keep()  # a message came: the lent share has room again
        more = await asyncio.wait_for(one_more, 1)
        assert taken == []
        for reservation in [*lent, more]:
            reservation.release()
        assert budget.reserved == 0 and budget.lent_bytes == 0

    asyncio.run(scenario())


def test_a_lent_reservation_alone_may_take_the_whole_budget() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=8, wait_seconds=0.2)
        alone = await asyncio.wait_for(budget.acquire(10**9, "a read larger than the budget", lent=True), 1)
        assert alone.amount == 100
        alone.release()

    asyncio.run(scenario())


def test_lent_bytes_taken_back_go_first_to_requests_that_hold_their_memory() -> None:
    """A read waiting to be lent memory does not take due lent bytes while a request for memory of its own waits:
    otherwise the memory of one call that sends nothing would pass to the next such call."""
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=8, wait_seconds=None)
        taken: list[str] = []
        kept = await budget.acquire(50, "a running request")
        silent = await _lent(budget, 40, 0.0, taken, "silent")  # due at once; 10 bytes free
        table = asyncio.ensure_future(budget.acquire(60, "a table"))  # 10 free + 40 due < 60: waits
        read = asyncio.ensure_future(budget.acquire(40, "the next read", lent=True))  # 10 + 40 would do
        await asyncio.sleep(0.05)
        assert not table.done() and not read.done() and taken == []  # the read leaves the lent bytes alone
        kept.release()  # 60 free: the table gets them
        got = await asyncio.wait_for(table, 1)
        assert got.amount == 60
        next_read = await asyncio.wait_for(read, 1)  # nobody else waits: the due lent bytes may go to it
        assert taken == ["silent"] and budget.reserved == 100
        for reservation in (got, next_read, silent):
            reservation.release()
        assert budget.reserved == 0

    asyncio.run(scenario())
