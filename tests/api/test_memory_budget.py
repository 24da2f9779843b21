"""The process-wide memory budget: concurrent requests hold at most the budget; the rest wait in a bounded
line, then get 503 with Retry-After."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import platform
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

import posenc.service.budget
from posenc.service.budget import MemoryBudget, Reservation, configure_malloc, release_free_memory
from posenc.service.errors import Unavailable
from posenc.service.http.app import create_app
from posenc.service.settings import Settings
from posenc.service.tables import TABLES
from tests.conftest import assert_runs_in_fresh_python, running_client


async def _hold(budget: MemoryBudget, nbytes: int, seconds: float, log: list[tuple[str, int]]) -> None:
    async with budget.reserve(nbytes, "a test"):
        log.append(("in", budget.reserved))
        await asyncio.sleep(seconds)


def test_requests_that_do_not_fit_wait_their_turn() -> None:
    async def scenario() -> list[tuple[str, int]]:
        budget = MemoryBudget(100, max_waiters=8, wait_seconds=5)
        log: list[tuple[str, int]] = []
        await asyncio.gather(*(_hold(budget, 60, 0.05, log) for _ in range(4)))
        assert budget.reserved == 0 and budget.waiting == 0
        return log

    log = asyncio.run(scenario())
    assert [reserved for _, reserved in log] == [60] * 4  # one at a time: 2 x 60 > 100


def test_a_request_larger_than_the_budget_runs_alone() -> None:
    async def scenario() -> list[tuple[str, int]]:
        budget = MemoryBudget(100, max_waiters=8, wait_seconds=5)
        log: list[tuple[str, int]] = []
        await asyncio.gather(_hold(budget, 10, 0.05, log), _hold(budget, 10**9, 0.05, log))
        return log

    assert sorted(asyncio.run(scenario())) == [("in", 10), ("in", 100)]


@pytest.mark.parametrize(("waiters", "wait_seconds", "message"), [(0, 5.0, "already wait"), (8, 0.05, "stayed in use")])
def test_full_line_or_long_wait_is_503(waiters: int, wait_seconds: float, message: str) -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=waiters, wait_seconds=wait_seconds)
        holder = asyncio.create_task(_hold(budget, 100, 0.5, []))
        await asyncio.sleep(0.01)
        with pytest.raises(Unavailable, match=message) as info:
            async with budget.reserve(1, "a test"):
                pass
        assert info.value.headers["Retry-After"] == "1"
        assert info.value.overloaded  # gRPC's RESOURCE_EXHAUSTED, not UNAVAILABLE (not ready)
        await holder
        assert budget.reserved == 0 and budget.waiting == 0

    asyncio.run(scenario())


async def _grow_after(budget: MemoryBudget, first: int, then: int, log: list[str], name: str) -> None:
    """A request that reserves `first`, then grows to `then` (its run, once its bytes are parsed), and holds it."""
    reservation = await budget.acquire(first, name)
    try:
        await asyncio.sleep(0.01)  # every request holds its first part before any grows
        await reservation.grow(then, name)
        log.append(f"{name} ran")
        await asyncio.sleep(0.02)
    except Unavailable as exc:
        log.append(f"{name}: {exc.message}")
    finally:
        reservation.release()


def test_requests_that_all_wait_to_grow_are_not_left_waiting_for_each_other() -> None:
    """Three requests hold 30 each of 100, then each wants 60 in all: none would give any back, so the last to
    wait gets its 503 at once (not after the wait's time limit), and the two others run in turn."""
    async def scenario() -> list[str]:
        budget = MemoryBudget(100, max_waiters=8, wait_seconds=30)
        log: list[str] = []
        async with asyncio.timeout(5):
            await asyncio.gather(*(_grow_after(budget, 30, 60, log, name) for name in "abc"))
        assert budget.reserved == 0 and budget.waiting == 0 and not budget._growing
        return log

    log = asyncio.run(scenario())
    assert sorted(line for line in log if line.endswith(" ran")) == ["a ran", "b ran"], log
    assert [line for line in log if not line.endswith(" ran")] == [
        "c: busy: c needs 30 bytes more while every request that holds memory waits for more (90 of 100 bytes, "
        "POSENC_MEMORY_BUDGET_BYTES); retry later"], log


def test_a_request_that_fills_the_budget_exactly_fits() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=0, wait_seconds=0.01)  # no line: waiting would be a 503
        first = await budget.acquire(40, "a test")
        second = budget.try_acquire(60)
        assert second is not None and budget.reserved == 100
        assert budget.try_acquire(1) is None
        second.release()
        (await budget.acquire(60, "a test")).release()
        first.release()
        assert budget.reserved == 0

    asyncio.run(scenario())


def test_concurrent_large_tables_share_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 distinct ~4 MiB bias tables at once under a 24 MiB budget: never more than the budget reserved,
    every answer a 200 (they wait) or a 503 with Retry-After — never a 5xx of another kind."""
    peak = {"reserved": 0}
    original = MemoryBudget.acquire

    async def recording(self: MemoryBudget, nbytes: int, what: str) -> Reservation:
        reservation = await original(self, nbytes, what)
        peak["reserved"] = max(peak["reserved"], self.reserved)
        return reservation

    monkeypatch.setattr(MemoryBudget, "acquire", recording)
    with running_client(memory_budget_bytes=24 << 20, memory_wait_seconds=30, cache_bytes=0) as client:
        urls = [f"/v1/alibi/bias?num_heads=16&query_length=256&key_length={256 + i}" for i in range(8)]
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda url: client.get(url).status_code, urls))
    assert statuses == [200] * 8
    assert 0 < peak["reserved"] <= 24 << 20


def test_a_block_that_raises_gives_its_bytes_back() -> None:
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=0, wait_seconds=5)  # no line: bytes still held → 503 at once
        with pytest.raises(RuntimeError, match="inside the reservation"):
            async with budget.reserve(100, "a test"):
                assert budget.reserved == 100
                raise RuntimeError("inside the reservation")
        assert budget.reserved == 0
        async with budget.reserve(100, "the next request"):
            assert budget.reserved == 100
        assert budget.reserved == 0

    asyncio.run(scenario())


def test_a_cancelled_block_gives_its_bytes_back() -> None:
    """A request whose client went away is cancelled inside its reservation."""
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=0, wait_seconds=5)
        holder = asyncio.create_task(_hold(budget, 100, 60, []))
        while budget.reserved == 0:
            await asyncio.sleep(0)
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        assert budget.reserved == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("failure", ["undecodable upload", "computation raises"])
def test_a_request_that_fails_inside_its_reservation_does_not_503_the_next(failure: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each failing request reserves the whole budget (1 MiB); the waiting line is 0, so a reservation it kept
    would answer the next request 503 at once."""
    table = "/v1/sinusoidal?max_position=1024&dim=128"  # 512 KiB of float32, 1.5 MiB held while computed
    settings = Settings(memory_budget_bytes=1 << 20, memory_waiters=0, cache_bytes=0)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        if failure == "undecodable upload":
            body = b"\x93NUMPY" + b"\0" * (600 << 10)  # 2 × Content-Length reserved for the upload
            r = client.post("/v1/t5/bias?query_length=2&key_length=2", content=body,
                            headers={"Content-Type": "application/x-npy"})
            assert r.status_code == 400, r.text
        else:
            def broken(self: object) -> None:
                raise RuntimeError("the computation failed")

            with monkeypatch.context() as patch:
                patch.setattr(TABLES["/v1/sinusoidal"].query, "compute", broken)
                r = client.get(table)
            assert r.status_code == 500 and r.json()["type"] == "internal"
        after = client.get(table)
        assert after.status_code == 200, after.text
        budget: MemoryBudget = client.app.state.process.memory_budget  # type: ignore[attr-defined]
        assert budget.reserved == 0


def test_release_free_memory_is_safe_to_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Safe where there is no glibc (nothing to call), and where there is: see the next test."""
    monkeypatch.setattr(posenc.service.budget, "_LIBC", None)
    assert release_free_memory() is None


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_release_free_memory_gives_freed_heap_back_and_keeps_live_blocks() -> None:
    """64 MiB of heap blocks, all but every 64th freed: the live ones pin the heap (free() cannot shrink it
    from the top), so only malloc_trim returns the free pages between them."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 << 10, 1024  # below glibc's mmap threshold: heap memory
    blocks = [libc.malloc(size) for _ in range(count)]
    assert all(blocks)
    for index, block in enumerate(blocks):
        ctypes.memset(block, index % 251, size)
    live = dict(list(enumerate(blocks))[::64])
    for index, block in enumerate(blocks):
        if index not in live:
            libc.free(block)
    try:
        before = resident_bytes()
        release_free_memory()
        released = before - resident_bytes()
        assert all(ctypes.string_at(block, size) == bytes([index % 251]) * size for index, block in live.items())
    finally:
        for block in live.values():
            libc.free(block)
    assert released >= 32 << 20, released  # of the 63 MiB freed


class _RecordingLibc:
    """glibc's malloc tuning calls, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append(("mallopt", parameter, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


# malloc.h: M_TRIM_THRESHOLD -1, M_MMAP_THRESHOLD -3, M_ARENA_MAX -8
@pytest.mark.parametrize(("arenas", "keep_bytes", "calls"), [
    (0, 0, []),  # glibc's defaults
    (2, 0, [("mallopt", -8, 2)]),
    (0, 1 << 20, [("mallopt", -3, 1 << 19), ("mallopt", -1, 1 << 20)]),
    (1, 1 << 30, [("mallopt", -8, 1), ("mallopt", -3, 32 << 20), ("mallopt", -1, 1 << 30)]),  # glibc's 32 MiB cap
])
def test_configure_malloc_sets_glibcs_parameters(monkeypatch: pytest.MonkeyPatch, arenas: int, keep_bytes: int,
                                                 calls: list[tuple[object, ...]]) -> None:
    libc = _RecordingLibc()
    monkeypatch.setattr(posenc.service.budget, "_LIBC", libc)
    configure_malloc(arenas, keep_bytes)
    release_free_memory()
    assert libc.calls == [*calls, ("malloc_trim", 0)]  # pad 0: everything above the heap's top is given back


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_configure_malloc_keeps_a_row_blocks_pages_for_the_next_block() -> None:
    """50 row blocks' temporaries (1024 x 64 float64 angles, cos, sin and their float32 casts, freed after each
    block) page-fault less than one block's pages once the service's malloc settings are on. With glibc's
    own thresholds each block handed its pages back and faulted them in again (about 400 faults a block)."""
    assert_runs_in_fresh_python("""
import resource
import numpy as np
from posenc.service.budget import configure_malloc
from posenc.service.settings import Settings

settings = Settings()
configure_malloc(settings.malloc_arenas, settings.malloc_keep_bytes)

def block():
    angles = np.arange(1024 * 64, dtype=np.float64).reshape(1024, 64)
    cos, sin = np.cos(angles), np.sin(angles)
    return cos.astype(np.float32), sin.astype(np.float32)

block()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    block()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
assert faults < 3 * 512 * 1024 // 4096, f"{faults} page faults in 50 blocks"
""")


def resident_bytes() -> int:
    """This process's resident set size (/proc/self/statm: pages)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_nobody_jumps_ahead_of_requests_already_waiting() -> None:
    """`try_acquire` (a response sharing a body in flight) takes nothing while another request waits, even
    where its bytes would fit: the waiter would wait behind every such sharer."""
    async def scenario() -> None:
        budget = MemoryBudget(100, max_waiters=8, wait_seconds=5)
        held = await budget.acquire(80, "a test")
        waiter = asyncio.create_task(budget.acquire(50, "a test"))
        await asyncio.sleep(0)
        assert budget.waiting == 1
        assert budget.try_acquire(10) is None  # 80 + 10 fit, but someone waits
        held.release()
        (await waiter).release()
        taken = budget.try_acquire(10)  # nobody waits any more
        assert taken is not None and budget.reserved == 10

    asyncio.run(scenario())


def _grown_to(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every total a reservation grows to from now on, in order (the real `Reservation.grow` still runs)."""
    held: list[int] = []
    original = Reservation.grow

    async def grow(self: Reservation, nbytes: int, what: str) -> None:
        held.append(nbytes)
        await original(self, nbytes, what)

    monkeypatch.setattr(Reservation, "grow", grow)
    return held


# 2 x [B, Hq, S, S] float32 scores of rope_attention (8 heads) at B=2, S=256
RUN_SCORES = 2 * 4 * 2 * 8 * 256 * 256


def test_an_inference_reserves_its_run_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attention scores of the run ([B, Hq, S, S] float32, twice) are in the inference's reservation:
    B=2, S=256 on rope_attention (8 heads) holds 8 MiB inside onnxruntime besides its 3 MiB body."""
    from posenc.service.testing import attention_inputs, kserve_request

    held = _grown_to(monkeypatch)
    request = kserve_request(attention_inputs(8, 8, 64, 2, 256), binary_output=True)
    with running_client() as client:
        answer = client.post("/v2/models/rope_attention/infer", content=request.body, headers=request.headers)
        assert answer.status_code == 200, answer.text
    assert held and held[-1] >= len(request.body) + 2 * 8 * 256 * 64 * 4 + RUN_SCORES


def test_a_model_check_reserves_its_run_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """`POST /v2/models/{name}/check` runs the model as an inference does: its attention scores are in its
    reservation beside the body (3 x the body: the body, its tensors and the output)."""
    from posenc.service.testing import attention_inputs, kserve_request

    held = _grown_to(monkeypatch)
    inputs = attention_inputs(8, 8, 64, 2, 256)
    request = kserve_request({**inputs, "expected_output": inputs["query"]}, binary_output=True)
    with running_client() as client:
        answer = client.post("/v2/models/rope_attention/check", content=request.body, headers=request.headers)
        assert answer.status_code == 200, answer.text
    assert held and held[-1] >= 3 * len(request.body) + RUN_SCORES


def test_a_reservation_that_grows_past_the_budget_runs_alone_with_exactly_the_budget() -> None:
    """Growing to more than the whole budget holds the whole budget, no more, once the others gave theirs back."""
    async def scenario() -> tuple[int, int, int]:
        budget = MemoryBudget(100, max_waiters=8, wait_seconds=5)
        other = await budget.acquire(20, "another request")
        reservation = await budget.acquire(30, "a test")
        growing = asyncio.ensure_future(reservation.grow(10**9, "a test"))
        await asyncio.sleep(0.01)
        waited = not growing.done()  # 20 bytes are another request's
        other.release()
        await asyncio.wait_for(growing, 5)
        held = (reservation.amount, budget.reserved)
        reservation.release()
        assert waited and budget.reserved == 0 and budget.waiting == 0
        return (*held, budget.capacity)

    assert asyncio.run(scenario()) == (100, 100, 100)
