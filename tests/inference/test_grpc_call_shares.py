"""The shares of the gRPC call limit, without a server: streams take at most three quarters of
POSENC_GRPC_MAX_CONCURRENT_RPCS, so unary calls always find a place; health and metadata calls are never counted."""

from __future__ import annotations

import asyncio

import pytest

from posenc.service.budget import MemoryBudget
from posenc.service.errors import Unavailable
from posenc.service.grpc.servicer import Servicer
from posenc.service.inference.dataplane import DataPlane
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.settings import Settings


def _servicer(settings: Settings) -> Servicer:
    budget = MemoryBudget(1 << 30, max_waiters=8, wait_seconds=None)
    plane = DataPlane(None, settings, budget, SharedMemoryRegistry(False), problems=[])  # type: ignore[arg-type]
    return Servicer(plane, lambda *args: None)


@pytest.mark.parametrize(("limit", "cap"), [(1, 1), (2, 2), (4, 3), (8, 6), (256, 192)])
def test_the_stream_cap(limit: int, cap: int) -> None:
    assert _servicer(Settings(grpc_max_concurrent_rpcs=limit)).stream_cap == cap


def test_streams_cannot_take_the_unary_share() -> None:
    servicer = _servicer(Settings(grpc_max_concurrent_rpcs=8))

    async def scenario() -> None:
        for _ in range(6):
            await servicer.admit_stream()
        seventh = asyncio.ensure_future(servicer.admit_stream())
        await asyncio.sleep(0.05)
        assert not seventh.done() and servicer.streams == 6  # the streams' share is full
        servicer.admit()
        servicer.admit()  # the unary share is still there
        with pytest.raises(Unavailable):
            servicer.admit()
        servicer.leave()  # a unary call ends: no place for a stream yet
        await asyncio.sleep(0.05)
        assert not seventh.done()
        servicer.leave_stream()  # a stream ends: the waiting one takes its place
        await asyncio.wait_for(seventh, 5)
        assert servicer.streams == 6 and servicer.active == 7

    asyncio.run(scenario())
