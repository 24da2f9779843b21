"""The gRPC servicer's own rules, without a server: the call limit and streams waiting for a place, a stream's
back-pressure, the status a failed call is recorded with, and an inference's model queue, memory and readiness
(the same as HTTP's); the health of each model and the drain's NOT_SERVING."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2
from tritonclient.grpc import service_pb2 as pb

from posenc.service.budget import MemoryBudget
from posenc.service.errors import Unavailable
from posenc.service.grpc import server as grpc_server
from posenc.service.grpc.servicer import STREAM_WINDOW, Servicer
from posenc.service.inference.dataplane import DataPlane
from posenc.service.inference.runtime.engine import Engine
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.request_kit.restricted import SharedMemoryCaller
from posenc.service.settings import Settings
from tests.onnx_models import REPOSITORY, grpc_infer_request, random_inputs

MODEL = "rope_attention"
NOBODY = SharedMemoryCaller(None, False)


def _servicer(settings: Settings, engine: Engine | None = None, budget: MemoryBudget | None = None) -> Servicer:
    budget = budget or MemoryBudget(1 << 34, max_waiters=8, wait_seconds=None)
    plane = DataPlane(engine, settings, budget, SharedMemoryRegistry(False), problems=[])  # type: ignore[arg-type]
    return Servicer(plane, lambda *args: None)


class Context:
    """What the handlers ask of a `grpc.aio.ServicerContext`; `write` blocks while `reading` is clear (a client
    that does not read its responses)."""

    def __init__(self, *, reading: bool = True, remaining: float | None = None, cancelled: bool = False) -> None:
        self.reading = asyncio.Event()
        if reading:
            self.reading.set()
        self.written: list[bytes] = []
        self.remaining, self._cancelled = remaining, cancelled

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def write(self, data: bytes) -> None:
        await self.reading.wait()
        self.written.append(data)

    def cancelled(self) -> bool:
        return self._cancelled

    def time_remaining(self) -> float | None:
        return self.remaining

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def code(self) -> None:
        return None

    async def abort(self, code: grpc.StatusCode, details: str, trailing: Any = ()) -> None:
        raise grpc.aio.AbortError(f"{code.name}: {details}")


def test_the_call_limit_is_exact() -> None:
    servicer = _servicer(Settings(grpc_max_concurrent_rpcs=2))
    servicer.admit()
    servicer.admit()
    with pytest.raises(Unavailable, match=r"^busy: 2 gRPC calls in progress \(POSENC_GRPC_MAX_CONCURRENT_RPCS=2\)") \
            as refused:
        servicer.admit()
    assert refused.value.overloaded and refused.value.headers["Retry-After"] == "1"
    servicer.leave()
    servicer.admit()  # a place came free
    assert servicer.active == 2


def test_a_stream_past_the_limit_waits_for_a_place() -> None:
    servicer = _servicer(Settings(grpc_max_concurrent_rpcs=2))

    async def scenario() -> None:
        await servicer.admit_stream()
        servicer.admit()
        third = asyncio.ensure_future(servicer.admit_stream())
        await asyncio.sleep(0.05)
        assert not third.done() and servicer.active == 2  # waiting, not refused, not admitted
        servicer.leave()
        await asyncio.wait_for(third, 5)
        assert servicer.active == 2

    asyncio.run(scenario())


def test_a_stream_whose_client_stops_reading_stops_being_read() -> None:
    """At most STREAM_WINDOW requests of a stream are read ahead of the responses written: a client that stops
    reading cannot make the server read (and hold) everything it sends."""
    servicer = _servicer(Settings())
    handler = servicer.stream("ModelStreamInfer")
    read = 0

    async def requests() -> AsyncIterator[bytes]:
        nonlocal read
        for _ in range(200):
            read += 1
            yield b"\xff\xff"  # malformed: each is answered with its own error, no model needed

    async def scenario() -> None:
        context = Context(reading=False)
        call = asyncio.ensure_future(handler(requests(), context))
        await asyncio.sleep(0.2)
        assert read <= STREAM_WINDOW + 2, read  # the window, the one being written, the one waiting for a place
        context.reading.set()  # the client reads again: the rest flows
        await asyncio.wait_for(call, 10)
        assert read == len(context.written) == 200
        assert "malformed inference.ModelInferRequest" in pb.ModelStreamInferResponse.FromString(
            context.written[0]).error_message

    asyncio.run(scenario())
    assert servicer.active == 0


@pytest.mark.parametrize(("remaining", "code"), [(-0.01, "DEADLINE_EXCEEDED"), (0.0, "DEADLINE_EXCEEDED"),
                                                 (5.0, "CANCELLED"), (None, "CANCELLED")])
def test_a_call_that_ended_under_its_work_is_recorded_as_what_ended_it(remaining: float | None, code: str) -> None:
    servicer = _servicer(Settings())
    assert servicer.status_of("ModelInfer", Context(remaining=remaining, cancelled=True),  # type: ignore[arg-type]
                              asyncio.CancelledError()) == (code, None)


def _engine(max_queue_size: int = 8) -> Engine:
    """The shipped models, loaded (closed by the test's own event loop: `engine.close()`)."""
    engine = Engine(Settings(model_repository=str(REPOSITORY), intra_op_num_threads=1, max_queue_size=max_queue_size))
    assert engine.load() == []
    return engine


def _infer_request(seq: int, model: str = MODEL) -> tuple[pb.ModelInferRequest, list[memoryview], int]:
    request = grpc_infer_request(random_inputs(8, 8, 64, 4, seq), model)
    size = request.ByteSize()
    raw = [memoryview(chunk) for chunk in request.raw_input_contents]
    del request.raw_input_contents[:]  # as the servicer gets it: the raw entries apart (`split_infer_request`)
    return request, raw, size


def test_an_inference_takes_a_place_in_the_models_queue() -> None:
    """With POSENC_MAX_QUEUE_SIZE=1, a second inference while one runs is refused as over HTTP (503 overloaded:
    RESOURCE_EXHAUSTED with a retry hint over gRPC)."""
    engine = _engine(max_queue_size=1)
    servicer = _servicer(engine.settings, engine)

    async def one() -> bytes:
        request, raw, size = _infer_request(512)
        return await servicer.infer(request, raw, NOBODY, size)

    async def scenario() -> list[Any]:
        answers = await asyncio.gather(*(one() for _ in range(3)), return_exceptions=True)
        await engine.close()
        return answers

    answers = asyncio.run(scenario())
    assert isinstance(answers[0], bytes), answers[0]
    refused = [answer for answer in answers[1:] if isinstance(answer, Unavailable)]
    assert len(refused) == 2 and all(exc.overloaded for exc in refused)
    assert "model 'rope_attention' is overloaded: 1 requests queued (POSENC_MAX_QUEUE_SIZE=1)" in refused[0].message


def test_an_inference_reserves_its_memory_first() -> None:
    """The memory budget holds three times the request's size before any work, as over HTTP: with the budget
    taken and nobody allowed to wait, the request is refused."""
    engine = _engine()
    budget = MemoryBudget(4 << 20, max_waiters=0, wait_seconds=None)
    servicer = _servicer(engine.settings, engine, budget)

    async def scenario() -> None:
        request, raw, size = _infer_request(16)
        assert 3 * size < budget.capacity  # fits, when nothing else holds the budget
        await servicer.infer(request, raw, NOBODY, size)
        held = await budget.acquire(budget.capacity - 3 * size + 1, "the rest")
        with pytest.raises(Unavailable, match="wait for memory to compute an inference on 'rope_attention'"):
            await servicer.infer(request, raw, NOBODY, size)
        held.release()
        assert budget.reserved == 0
        await engine.close()

    asyncio.run(scenario())


def test_a_model_that_is_not_ready_is_unavailable(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    shutil.copytree(REPOSITORY / MODEL, repository / MODEL)
    shutil.copytree(REPOSITORY / MODEL, repository / "broken")
    (repository / "broken" / "config.json").write_text("{not json")
    engine = Engine(Settings(model_repository=str(repository), intra_op_num_threads=1))
    assert engine.load() != []
    servicer = _servicer(engine.settings, engine)
    request, raw, size = _infer_request(16, "broken")
    with pytest.raises(Unavailable, match=r"^model 'broken' is not ready: .*not valid JSON"):
        asyncio.run(servicer.infer(request, raw, NOBODY, size))
    statuses = grpc_server.health_statuses([], engine.models)
    assert statuses["broken"] == health_pb2.HealthCheckResponse.NOT_SERVING
    assert statuses[MODEL] == health_pb2.HealthCheckResponse.SERVING
    asyncio.run(engine.close())


def test_health_is_not_serving_with_problems_and_during_the_drain() -> None:
    assert set(grpc_server.health_statuses(["a model failed"], {}).values()) == {
        health_pb2.HealthCheckResponse.NOT_SERVING}

    class Server:
        grace: float | None = None

        async def stop(self, grace: float) -> None:
            self.grace = grace

    async def scenario() -> tuple[int, float | None]:
        checker, server = health.aio.HealthServicer(), Server()
        await checker.set("", health_pb2.HealthCheckResponse.SERVING)
        await grpc_server._stop(server, checker, 7.0)  # type: ignore[arg-type]
        answer = await checker.Check(health_pb2.HealthCheckRequest(service=""), None)  # type: ignore[arg-type]
        return answer.status, server.grace

    assert asyncio.run(scenario()) == (health_pb2.HealthCheckResponse.NOT_SERVING, 7.0)


def test_a_call_refused_before_the_data_plane_gives_its_memory_back() -> None:
    """A ModelInfer message is read under the memory budget (`Servicer.receive`); refused as malformed before the
    data plane sees it, the call leaves nothing reserved."""
    budget = MemoryBudget(1 << 30, max_waiters=8, wait_seconds=None)
    servicer = _servicer(Settings(), budget=budget)
    handler = servicer.unary("ModelInfer", pb.ModelInferRequest, servicer.ModelInfer)

    async def message() -> AsyncIterator[bytes]:
        yield b"\xff\xff" * 1000

    async def scenario() -> None:
        with pytest.raises(grpc.aio.AbortError, match=r"^INVALID_ARGUMENT: malformed inference\.ModelInferRequest"):
            await handler(message(), Context())

    asyncio.run(scenario())
    assert budget.reserved == 0 and servicer.active == 0
