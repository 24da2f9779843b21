"""A gRPC message is admitted before it is read (issue 62), without a server: the data plane's admission step
refuses a message no model can take before gRPC core is asked for a byte of it, a message asked for holds lent
memory that a waiter takes back once its time has come (the unary call, or the idle stream, ends
RESOURCE_EXHAUSTED), and the model a message names is read from its leading fields, before it is parsed."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from posenc.service.budget import MemoryBudget
from posenc.service.errors import BadRequest
from posenc.service.grpc.servicer import GrpcInferCall, Servicer, leading_names
from posenc.service.inference.dataplane import DataPlane
from posenc.service.inference.runtime.engine import Engine
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.request_kit.restricted import SharedMemoryCaller
from posenc.service.settings import Settings
from tests.inference.test_grpc_servicer import Context, _engine
from tests.onnx_models import REPOSITORY, grpc_infer_request, random_inputs

MODEL = "rope_attention"
NOBODY = SharedMemoryCaller(None, False)
GiB = 1 << 30


def _servicer(settings: Settings, budget: MemoryBudget, engine: Engine | None = None,
              problems: list[str] | None = None) -> Servicer:
    plane = DataPlane(engine, settings, budget, SharedMemoryRegistry(False),  # type: ignore[arg-type]
                      problems=problems if problems is not None else [])
    return Servicer(plane, lambda *args: None)


async def _until(condition: Callable[[], object], what: str) -> None:
    """Wait for `condition()` to hold (a failure, not a hang, when it never does)."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(poll(), 10)
    except TimeoutError:
        raise AssertionError(f"never: {what}") from None


async def _taken_back(budget: MemoryBudget, call: asyncio.Future[object], ends: str) -> None:
    """A waiter for the whole budget takes the call's lent memory back; the call ends with the status `ends`."""
    whole = await asyncio.wait_for(budget.acquire(budget.capacity, "the whole budget"), 10)
    with pytest.raises(grpc.aio.AbortError, match=ends):
        await asyncio.wait_for(call, 10)
    whole.release()


class Asked:
    """A request iterator that counts the messages asked of it and sends `messages`, then nothing, ever."""

    def __init__(self, *messages: bytes) -> None:
        self.messages, self.asked = list(messages), 0

    async def __call__(self) -> AsyncIterator[bytes]:
        for message in self.messages:
            self.asked += 1
            yield message
        self.asked += 1
        await asyncio.Event().wait()
        yield b""


def test_the_leading_names_of_a_request() -> None:
    request = grpc_infer_request(random_inputs(8, 8, 64, 1, 2), MODEL, "seven")
    request.model_version = "1"
    assert leading_names(request.SerializeToString()) == (MODEL, "1", "seven")
    assert leading_names(pb.ModelInferRequest(model_name=MODEL).SerializeToString()) == (MODEL, "", "")
    inputs_first = pb.ModelInferRequest(inputs=request.inputs).SerializeToString() + b"\x0a\x02ab"
    assert leading_names(inputs_first) is None  # parsed first, then admitted
    assert leading_names(b"\x0a" + bytes([0x80, 0x80, 0x01]) + b"x" * (1 << 14)) is None  # a name of 16 KiB
    assert leading_names(b"\x0a\x02\xff\xfe") is None  # not UTF-8
    assert leading_names(b"\x0a\x10ab") is None  # cut short
    assert leading_names(b"") is None


def test_a_message_no_model_can_take_is_not_read(tmp_path: Path) -> None:
    """No model ready: UNAVAILABLE naming why, before gRPC core is asked for the message (a 48 MiB message to a
    loading model used to be read, and parsed, before it was refused)."""
    repository = tmp_path / "models"
    shutil.copytree(REPOSITORY / MODEL, repository / "broken")
    (repository / "broken" / "config.json").write_text("{not json")
    engine = Engine(Settings(model_repository=str(repository), intra_op_num_threads=1))
    problems = engine.load()
    assert problems
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(engine.settings, budget, engine, problems)
    message = Asked(grpc_infer_request(random_inputs(8, 8, 64, 1, 2), "broken").SerializeToString())

    async def scenario() -> None:
        infer = servicer.unary("ModelInfer", pb.ModelInferRequest, servicer.ModelInfer)
        with pytest.raises(grpc.aio.AbortError, match=r"^UNAVAILABLE: not ready: .*not valid JSON"):
            await infer(message(), Context())
        stream = servicer.stream("ModelStreamInfer")
        with pytest.raises(grpc.aio.AbortError, match=r"^UNAVAILABLE: not ready: "):
            await stream(message(), Context())
        await engine.close()

    asyncio.run(scenario())
    assert message.asked == 0 and budget.reserved == 0 and servicer.active == 0


def test_a_call_that_sends_nothing_gives_its_memory_to_a_waiter() -> None:
    settings = Settings(memory_wait_seconds=0.4)  # lent memory goes back after 0.2 s
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(settings, budget)
    assert servicer.reclaim_seconds == pytest.approx(0.2)
    silent = Asked()

    async def scenario() -> None:
        infer = servicer.unary("ModelInfer", pb.ModelInferRequest, servicer.ModelInfer)
        call = asyncio.ensure_future(infer(silent(), Context()))
        await _until(lambda: budget.lent_bytes, "the message's memory lent")
        assert budget.lent_bytes == 2 * settings.max_request_bytes and silent.asked == 1
        await _taken_back(budget, call, r"^RESOURCE_EXHAUSTED: the request message had not arrived 0\.2 s after the "
                                        r"server asked for it, while other requests")

    asyncio.run(scenario())
    assert budget.reserved == 0 and budget.lent_bytes == 0 and servicer.active == 0


def test_an_idle_stream_gives_its_memory_to_a_waiter_and_ends() -> None:
    """A stream whose requests are all answered and written, waiting for its next one, holds that one's memory
    until a waiter needs it; then it ends RESOURCE_EXHAUSTED (its answers already sent)."""
    settings = Settings(memory_wait_seconds=0.4)  # lent memory goes back after 0.2 s
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(settings, budget)
    assert servicer.stream_reclaim_seconds == pytest.approx(0.2)
    requests = Asked(b"\xff\xff")  # malformed: answered with its own error, no model needed
    context = Context()

    async def scenario() -> None:
        call = asyncio.ensure_future(servicer.stream("ModelStreamInfer")(requests(), context))
        await _until(lambda: context.written and budget.lent_bytes, "an answer, and the next request's memory lent")
        await _taken_back(budget, call, r"^RESOURCE_EXHAUSTED: the stream sent no request for 0\.2 s with none in "
                                        r"progress, while other requests waited")

    asyncio.run(scenario())
    assert "malformed" in pb.ModelStreamInferResponse.FromString(context.written[0]).error_message
    assert budget.reserved == 0 and budget.lent_bytes == 0 and servicer.active == 0


def test_a_request_that_names_its_model_twice_is_refused() -> None:
    """Admitted to the model its leading fields name, a message whose later copy of the field (protobuf keeps the
    last) names another is refused rather than run on a model that did not admit it."""
    engine = _engine()
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(engine.settings, budget, engine)
    data = grpc_infer_request(random_inputs(8, 8, 64, 1, 2), MODEL).SerializeToString() + b"\x0a\x05other"

    async def scenario() -> None:
        call = await servicer.infer_call(data, NOBODY, None)
        assert isinstance(call, GrpcInferCall) and call.model_name == MODEL
        with pytest.raises(BadRequest, match=r"names its model twice \('rope_attention' version '', then 'other'"):
            await servicer.run(call)
        await engine.close()

    asyncio.run(scenario())
    assert budget.reserved == 0


class StoppedContext(Context):
    """A context whose server stopped under the read (the drain's end): gRPC raises its `_ServerStoppedError`."""

    async def read(self) -> bytes:
        from grpc._cython import cygrpc

        raise cygrpc._ServerStoppedError("Server already stopped.")


def test_a_read_the_shutdown_ends_is_unavailable_not_an_error() -> None:
    """The soak's SIGTERM found a message being read when the server stopped: an ERROR with a traceback
    ('unhandled error in gRPC ModelInfer'); now the client's status, UNAVAILABLE, and no error."""
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(Settings(), budget)

    async def scenario() -> None:
        infer = servicer.unary("ModelInfer", pb.ModelInferRequest, servicer.ModelInfer)
        with pytest.raises(grpc.aio.AbortError, match=r"^UNAVAILABLE: the server stopped"):
            await infer(Asked()(), StoppedContext())

    errors: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = errors.append  # type: ignore[method-assign]
    logger = logging.getLogger("posenc.grpc")
    logger.addHandler(handler)
    try:
        asyncio.run(scenario())
    finally:
        logger.removeHandler(handler)
    assert not errors, errors
    assert budget.reserved == 0 and servicer.active == 0


@pytest.mark.parametrize(("free", "others", "trimmed"), [
    (1 << 20, 0, False), (1 << 40, 0, True), (None, 0, True), (1 << 40, 3, False), (None, 1, False)])
def test_a_large_message_trims_the_heaps_only_past_what_they_may_keep(monkeypatch: pytest.MonkeyPatch,
                                                                      free: int | None, others: int,
                                                                      trimmed: bool) -> None:
    """`malloc_trim` after every message of 16 MiB or more cost 20-30 ms of a 25 MB ModelInfer (the trim, then the
    next allocations faulting the pages in again); it runs only once the heaps hold more freed memory than
    POSENC_MALLOC_ARENAS x POSENC_MALLOC_KEEP_BYTES, or where that cannot be known, and only while no other gRPC
    call is in progress (`others`): with 8 clients of 25 MB messages, a trim per message had an eighth of the
    server's core clearing pages, since the other calls' copies took that memory next."""
    from posenc.service import budget as budget_module
    from posenc.service.budget import RELEASE_AFTER_BYTES
    from posenc.service.grpc import servicer as servicer_module

    trims: list[int] = []
    monkeypatch.setattr(servicer_module, "release_free_memory", lambda: trims.append(1))
    monkeypatch.setattr(budget_module, "heap_free_bytes", lambda: free)
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(Settings(), budget)
    assert servicer.kept_bytes == 2 * 64 << 20  # the defaults: 2 heaps keeping 64 MiB each
    servicer.active = 1 + others  # this call (`admit` counts it), and the others in progress

    async def scenario() -> int:
        data, held = await servicer.receive(Asked(bytes(RELEASE_AFTER_BYTES))(), Context())
        held.release()
        return len(data)

    assert asyncio.run(scenario()) == RELEASE_AFTER_BYTES
    assert trims == ([1] if trimmed else []) and budget.reserved == 0


def test_a_stream_waiting_for_its_next_request_ends_when_the_server_drains() -> None:
    """The soak's SIGTERM found a stream whose client kept sending: it was cut at the graceful timeout (exit 1). A
    stream with every answer written now ends UNAVAILABLE once the server drains and its client has been quiet for
    DRAIN_QUIET_SECONDS (ended at once, a stream whose client was writing ended INTERNAL on the client: the next
    soak), long before its idle time."""
    settings = Settings(grpc_stream_idle_seconds=60)
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(settings, budget)
    requests = Asked(b"\xff\xff")  # malformed: answered with its own error, no model needed
    context = Context()

    async def scenario() -> float:
        call = asyncio.ensure_future(servicer.stream("ModelStreamInfer")(requests(), context))
        await _until(lambda: context.written, "the first answer written")
        servicer.drain(10)
        start = time.monotonic()
        with pytest.raises(grpc.aio.AbortError, match=r"^UNAVAILABLE: the server is shutting down"):
            await asyncio.wait_for(call, 10)
        return time.monotonic() - start

    assert asyncio.run(scenario()) < 5
    assert budget.reserved == 0 and servicer.active == 0


def test_a_stream_whose_client_writes_is_served_on_while_the_server_drains() -> None:
    """A stream whose client sends a request every 0.3 s (never quiet for DRAIN_QUIET_SECONDS) is not ended by the
    drain: every request it sends is answered, until it ends its requests itself."""
    settings = Settings(grpc_stream_idle_seconds=60)
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(settings, budget)
    context = Context()

    async def requests() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"\xff\xff"
            await asyncio.sleep(0.3)

    async def scenario() -> None:
        call = asyncio.ensure_future(servicer.stream("ModelStreamInfer")(requests(), context))
        await _until(lambda: context.written, "the first answer written")
        servicer.drain(10)
        await asyncio.wait_for(call, 10)

    asyncio.run(scenario())
    assert len(context.written) == 8 and budget.reserved == 0 and servicer.active == 0


def test_a_call_whose_message_has_not_come_ends_when_the_server_drains() -> None:
    """The next soak: a ModelInfer that sent its headers and no message, 3 s before the SIGTERM, was cut at the
    graceful timeout (exit 1, a WARNING naming it). It now ends UNAVAILABLE half the graceful timeout after the drain
    began, its memory back."""
    budget = MemoryBudget(GiB, max_waiters=8, wait_seconds=None)
    servicer = _servicer(Settings(), budget)
    silent = Asked()

    async def scenario() -> float:
        infer = servicer.unary("ModelInfer", pb.ModelInferRequest, servicer.ModelInfer)
        call = asyncio.ensure_future(infer(silent(), Context()))
        await _until(lambda: budget.lent_bytes, "the message's memory lent")
        servicer.drain(1.0)
        start = time.monotonic()
        with pytest.raises(grpc.aio.AbortError, match=r"^UNAVAILABLE: the server is shutting down: the request "
                                                      r"message had not arrived 0\.5 s after the drain began"):
            await asyncio.wait_for(call, 10)
        return time.monotonic() - start

    assert 0.4 < asyncio.run(scenario()) < 5
    assert budget.reserved == 0 and budget.lent_bytes == 0 and servicer.active == 0
