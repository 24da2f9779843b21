"""The gRPC service under bad and hostile input, against a real `posenc serve`: malformed messages, byte counts that
lie, typed contents in the wrong field, oversized messages, unknown models, deadlines, half-closed, cancelled and
unread streams, and many streams at once. Never INTERNAL or UNKNOWN, never a hang; the server answers afterwards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from posenc.service.testing import ServerProcess
from tests.onnx_models import grpc_infer_request, random_inputs

MODEL = "rope_attention"
SERVICE = "/inference.GRPCInferenceService/"
LIMIT = 4 << 20  # POSENC_MAX_REQUEST_BYTES of the server under test
CONCURRENT = 64  # POSENC_GRPC_MAX_CONCURRENT_RPCS of the server under test


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    settings = {"log_level": "warning", "max_request_bytes": LIMIT, "grpc_max_concurrent_rpcs": CONCURRENT}
    with ServerProcess(settings, grpc=True) as process:
        yield process


@pytest.fixture
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(server.grpc_address, options=options) as channel:
        yield channel


def raw_call(channel: grpc.Channel, method: str, data: bytes, timeout: float = 30) -> bytes:
    return channel.unary_unary(SERVICE + method)(data, timeout=timeout)


def infer_request(inputs: dict[str, np.ndarray], model: str = MODEL, request_id: str = "") -> pb.ModelInferRequest:
    return grpc_infer_request(inputs, model, request_id)


def status_of(channel: grpc.Channel, request: pb.ModelInferRequest) -> tuple[grpc.StatusCode, str]:
    try:
        raw_call(channel, "ModelInfer", request.SerializeToString())
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def alive(channel: grpc.Channel) -> bool:
    response = pb.ServerLiveResponse.FromString(raw_call(channel, "ServerLive", b"", timeout=10))
    ok = status_of(channel, infer_request(random_inputs(8, 8, 64, 1, 2)))[0] == grpc.StatusCode.OK
    return response.live and ok


def test_malformed_messages_are_invalid_argument(channel: grpc.Channel) -> None:
    for data in (b"\xff\xff\xff", b"\x0a\x80", b"\x12\x05ab"):
        with pytest.raises(grpc.RpcError) as info:
            raw_call(channel, "ModelInfer", data)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed inference.ModelInferRequest message" in info.value.details()
    assert alive(channel)


def test_byte_counts_that_lie(channel: grpc.Channel) -> None:
    inputs = random_inputs(8, 8, 64, 1, 2)
    short = infer_request(inputs)
    short.raw_input_contents[0] = short.raw_input_contents[0][:-4]
    code, message = status_of(channel, short)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message == "input 'query': raw_input_contents[0] is 4092 bytes, shape [1, 8, 2, 64] FP32 needs 4096"
    missing = infer_request(inputs)
    del missing.raw_input_contents[-1]
    code, message = status_of(channel, missing)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents has 3 entries" in message
    huge = infer_request(inputs)
    huge.inputs[0].shape[:] = [1 << 40, 1 << 40, 8, 64]
    code, message = status_of(channel, huge)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents[0] is 4096 bytes" in message
    negative = infer_request(inputs)
    negative.inputs[0].shape[:] = [-1, 8, 2, 64]
    code, message = status_of(channel, negative)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "non-negative integers" in message


def test_typed_contents(channel: grpc.Channel) -> None:
    """Every input as typed contents answers what the raw bytes answer; the wrong field, or typed FP16, is a 400."""
    inputs = random_inputs(8, 8, 64, 1, 3, start=9)
    typed = pb.ModelInferRequest(model_name=MODEL)
    for name, array in inputs.items():
        tensor = typed.inputs.add(name=name, shape=array.shape)
        if array.dtype == np.float32:
            tensor.datatype = "FP32"
            tensor.contents.fp32_contents.extend(array.reshape(-1).tolist())
        else:
            tensor.datatype = "INT64"
            tensor.contents.int64_contents.extend(array.reshape(-1).tolist())
    by_type = pb.ModelInferResponse.FromString(raw_call(channel, "ModelInfer", typed.SerializeToString()))
    by_raw = pb.ModelInferResponse.FromString(
        raw_call(channel, "ModelInfer", infer_request(inputs).SerializeToString()))
    assert by_type.raw_output_contents[0] == by_raw.raw_output_contents[0]
    wrong = pb.ModelInferRequest()
    wrong.CopyFrom(typed)
    wrong.inputs[3].contents.Clear()
    wrong.inputs[3].contents.int_contents.extend(inputs["position_ids"].reshape(-1).tolist())
    code, message = status_of(channel, wrong)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message == "input 'position_ids': datatype INT64 takes its contents in int64_contents (got int_contents)"
    half = pb.ModelInferRequest()
    half.CopyFrom(typed)
    half.inputs[0].datatype = "FP16"
    code, message = status_of(channel, half)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "FP16 has no typed contents" in message
    mixed = infer_request(inputs)
    mixed.inputs[0].contents.fp32_contents.append(1.0)
    assert status_of(channel, mixed)[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_oversized_message_is_resource_exhausted(channel: grpc.Channel) -> None:
    request = infer_request(random_inputs(8, 8, 64, 1, 2))
    request.raw_input_contents[0] = bytes(LIMIT + 1)
    code, message = status_of(channel, request)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, message
    assert alive(channel)


def test_unknown_model_and_version(channel: grpc.Channel) -> None:
    inputs = random_inputs(8, 8, 64, 1, 2)
    assert status_of(channel, infer_request(inputs, "no_such_model"))[0] == grpc.StatusCode.NOT_FOUND
    versioned = infer_request(inputs)
    versioned.model_version = "7"
    code, message = status_of(channel, versioned)
    assert code == grpc.StatusCode.NOT_FOUND and "version" in message


def test_deadline_exceeded(channel: grpc.Channel) -> None:
    request = infer_request(random_inputs(8, 8, 64, 4, 512))
    with pytest.raises(grpc.RpcError) as info:
        raw_call(channel, "ModelInfer", request.SerializeToString(), timeout=0.001)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert alive(channel)


def stream_requests(count: int, model: str = MODEL) -> list[bytes]:
    return [infer_request(random_inputs(8, 8, 64, 1, 2, start=i), model, str(i)).SerializeToString()
            for i in range(count)]


def test_half_closed_and_empty_streams(channel: grpc.Channel) -> None:
    """The client closes its side after sending: every request is answered, then the stream ends OK."""
    call = channel.stream_stream(SERVICE + "ModelStreamInfer")
    responses = [pb.ModelStreamInferResponse.FromString(r) for r in call(iter(stream_requests(20)), timeout=60)]
    assert [r.infer_response.id for r in responses] == [str(i) for i in range(20)]
    assert all(not r.error_message for r in responses)
    assert list(call(iter([]), timeout=10)) == []
    bad = [b"\xff\xff", *stream_requests(1)]
    answers = [pb.ModelStreamInferResponse.FromString(r) for r in call(iter(bad), timeout=30)]
    assert "malformed inference.ModelInferRequest" in answers[0].error_message and not answers[1].error_message


def test_cancelled_and_unread_streams_leave_the_server_serving(server: ServerProcess, channel: grpc.Channel) -> None:
    """Streams cancelled after one response or never read: the server serves on, and logs no error (neither a
    failed write to the cancelled call nor a task left pending)."""
    call = channel.stream_stream(SERVICE + "ModelStreamInfer")
    for _ in range(3):
        responses = call(iter(stream_requests(200)), timeout=60)
        next(responses)  # read one, leave the rest unread, then cancel
        responses.cancel()
        unread = call(iter(stream_requests(200)), timeout=60)  # never read at all
        assert alive(channel)
        unread.cancel()
        assert alive(channel)
    time.sleep(0.5)
    errors = [line for line in server.log().splitlines() if " ERROR " in line]
    assert not errors, errors


def test_many_concurrent_streams_are_bounded(server: ServerProcess) -> None:
    """1,000 streams at once on a server that serves 64 calls at a time: the others wait for a place, unread,
    and every one is answered; nothing hangs."""
    request = stream_requests(1)[0]

    async def one(channel: grpc.aio.Channel) -> grpc.StatusCode:
        call = channel.stream_stream(SERVICE + "ModelStreamInfer")(iter([request]), timeout=120)
        try:
            async for data in call:
                assert not pb.ModelStreamInferResponse.FromString(data).error_message
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    async def main() -> list[grpc.StatusCode]:
        async with grpc.aio.insecure_channel(server.grpc_address) as channel:
            return await asyncio.gather(*(one(channel) for _ in range(1000)))

    assert set(asyncio.run(main())) == {grpc.StatusCode.OK}
    with grpc.insecure_channel(server.grpc_address) as channel:
        assert alive(channel)


def test_unary_calls_past_the_limit_are_resource_exhausted_with_a_retry_hint(server: ServerProcess) -> None:
    request = infer_request(random_inputs(8, 8, 64, 1, 64)).SerializeToString()

    async def one(channel: grpc.aio.Channel) -> tuple[grpc.StatusCode, str | None]:
        call = channel.unary_unary(SERVICE + "ModelInfer")(request, timeout=120)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            trailing = dict(exc.trailing_metadata() or ())
            return exc.code(), trailing.get("retry-after")
        return grpc.StatusCode.OK, None

    async def main() -> list[tuple[grpc.StatusCode, str | None]]:
        async with grpc.aio.insecure_channel(server.grpc_address) as channel:
            return await asyncio.gather(*(one(channel) for _ in range(400)))

    answers = asyncio.run(main())
    assert {code for code, _ in answers} <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert all(retry == "1" for code, retry in answers if code == grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert sum(code == grpc.StatusCode.OK for code, _ in answers) >= CONCURRENT


def test_unary_calls_ended_while_their_messages_arrive_log_no_error(server: ServerProcess,
                                                                      channel: grpc.Channel) -> None:
    """ModelInfer calls whose deadline passes, or which are cancelled, while their messages are on their way (the
    server reads them itself, under its memory budget): each ends quietly, where the server's answer to a call that
    had ended made gRPC log a failed send as an ERROR."""
    request = infer_request(random_inputs(8, 8, 64, 2, 256)).SerializeToString()  # 3 MiB, under LIMIT
    infer = channel.unary_unary(SERVICE + "ModelInfer")
    for seconds in (0.001, 0.002, 0.004, 0.008, 0.016, 0.032):
        futures = [infer.future(request, timeout=seconds) for _ in range(8)]
        cancelled = [infer.future(request, timeout=60) for _ in range(8)]
        time.sleep(seconds)
        for future in cancelled:
            future.cancel()
        for future in futures:
            assert future.exception() is None or future.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert alive(channel)
    time.sleep(0.5)
    errors = [line for line in server.log().splitlines() if " ERROR " in line]
    assert not errors, errors
