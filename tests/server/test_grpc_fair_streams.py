"""Streams cannot starve other calls (issue 55, item 4): against a real `posenc serve` with a small call limit and
idle time, more streams than the limit sit idle, yet `ServerLive` and a `ModelInfer` of another client are
answered at once; each idle stream ends DEADLINE_EXCEEDED, naming POSENC_GRPC_STREAM_IDLE_SECONDS, after that
long, and the streams that waited for a place get one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from posenc.service.testing import ServerProcess
from tests.onnx_models import grpc_infer_request, random_inputs

SERVICE = "/inference.GRPCInferenceService/"
MODEL = "rope_attention"
LIMIT = 8  # POSENC_GRPC_MAX_CONCURRENT_RPCS: 6 places for streams, 2 kept for unary calls
STREAMS = 10  # more than the limit
IDLE = 2.0  # POSENC_GRPC_STREAM_IDLE_SECONDS


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    settings = {"log_level": "warning", "grpc_max_concurrent_rpcs": LIMIT, "grpc_stream_idle_seconds": IDLE}
    with ServerProcess(settings, grpc=True) as process:
        yield process


def test_idle_streams_past_the_limit_starve_nobody_and_end(server: ServerProcess) -> None:
    data = grpc_infer_request(random_inputs(8, 8, 64, 1, 2), MODEL).SerializeToString()
    answered: list[float] = []  # when each stream got its one response
    first_places = asyncio.Event()

    async def one_then_idle(channel: grpc.aio.Channel, forever: asyncio.Event) -> tuple[grpc.StatusCode, str, float]:
        async def requests() -> AsyncIterator[bytes]:
            yield data
            await forever.wait()  # then nothing, the call left open

        call = channel.stream_stream(SERVICE + "ModelStreamInfer")(requests(), timeout=30)
        try:
            async for response in call:
                assert not pb.ModelStreamInferResponse.FromString(response).error_message
                answered.append(time.monotonic())
                if len(answered) >= LIMIT - LIMIT // 4:
                    first_places.set()
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or "", time.monotonic()
        return grpc.StatusCode.OK, "", time.monotonic()

    async def main() -> None:
        forever = asyncio.Event()
        async with grpc.aio.insecure_channel(server.grpc_address) as streams:
            calls = [asyncio.ensure_future(one_then_idle(streams, forever)) for _ in range(STREAMS)]
            await asyncio.wait_for(first_places.wait(), 15)  # every place streams may take is held, idle
            async with grpc.aio.insecure_channel(server.grpc_address) as other:  # another client, at once
                live = await other.unary_unary(SERVICE + "ServerLive")(b"", timeout=3)
                assert pb.ServerLiveResponse.FromString(live).live
                infer = await other.unary_unary(SERVICE + "ModelInfer")(data, timeout=5)
                assert pb.ModelInferResponse.FromString(infer).raw_output_contents
                # answered while every idle stream still held its place: none had ended yet
                assert not any(call.done() for call in calls)
            ends = await asyncio.wait_for(asyncio.gather(*calls), 25)
            forever.set()
        assert len(answered) == STREAMS  # the streams that waited got a place once the idle ones ended
        for code, message, _ in ends:
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED, (code, message)
            assert "POSENC_GRPC_STREAM_IDLE_SECONDS" in message and "no request for 2 s" in message
        # each ended no sooner than IDLE after its response (the earliest end against the earliest response)
        assert min(end for _, _, end in ends) - min(answered) >= IDLE * 0.9

    asyncio.run(main())


def test_a_stream_that_keeps_sending_is_not_idle(server: ServerProcess) -> None:
    """Requests spaced by less than the idle time: every one answered, the stream ends OK when the client closes."""
    data = [grpc_infer_request(random_inputs(8, 8, 64, 1, 2, start=i), MODEL, str(i)).SerializeToString()
            for i in range(3)]

    async def main() -> list[str]:
        async def requests() -> AsyncIterator[bytes]:
            for message in data:
                yield message
                await asyncio.sleep(IDLE * 0.6)

        async with grpc.aio.insecure_channel(server.grpc_address) as channel:
            call = channel.stream_stream(SERVICE + "ModelStreamInfer")(requests(), timeout=30)
            ids = [pb.ModelStreamInferResponse.FromString(r).infer_response.id async for r in call]
            assert await call.code() == grpc.StatusCode.OK
            return ids

    assert asyncio.run(main()) == ["0", "1", "2"]
