"""gRPC's doors against a real `posenc serve` (issue 55): what gRPC core may hold before posenc reads a message.

* A compressed message is refused (UNIMPLEMENTED) before it is inflated: 1 MiB of zeros is about 1 kB of gzip on the
  wire, so compressed messages would let a client make the server hold a thousand times what it sent.
* A message of millions of tiny unknown fields is refused after a bounded walk, in a worker thread: `/readyz` answers
  within a second throughout, and the server's own CPU time (from /proc, not wall time) does not grow with the size
  past the field cap.
* Many concurrent large unary messages are received a budget's worth at a time (each read holds
  2 × POSENC_MAX_REQUEST_BYTES until its message has arrived), so the server's peak stays under the documented
  bound (`memory_bound`), where gRPC core used to take them all at once.
* Streams whose answers are never read hold a 64 KiB window each in gRPC core (no BDP probing), not megabytes.
"""

from __future__ import annotations

import asyncio
import http.client
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from posenc.service.budget import memory_bound
from posenc.service.settings import Settings
from posenc.service.testing import ServerProcess
from tests.onnx_models import grpc_infer_request, random_inputs

MODEL = "rope_attention"
SERVICE = "/inference.GRPCInferenceService/"
MiB = 1024 * 1024
READYZ_LIMIT_SECONDS = 1.0


SETTINGS = {"log_level": "warning", "max_request_bytes": 64 * MiB}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess(SETTINGS, grpc=True) as process:
        yield process


def _channel(server: ServerProcess, **kwargs: object) -> grpc.Channel:
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    return grpc.insecure_channel(server.grpc_address, options=options, **kwargs)  # type: ignore[arg-type]


def _cpu_seconds(pid: int) -> float:
    """utime + stime of the server process (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # clock ticks (USER_HZ = 100 on Linux)


class ReadyzSampler:
    """`/readyz` asked every 0.1 s on a connection of its own while a block runs: the slowest answer."""

    def __init__(self, server: ServerProcess) -> None:
        self.host, port = server.address.rsplit(":", 1)
        self.port = int(port)
        self.slowest = 0.0
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            try:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=5)
                connection.request("GET", "/readyz")
                status = connection.getresponse().status
                connection.close()
                if status != 200:
                    self.failures.append(f"/readyz {status}")
            except OSError as exc:
                self.failures.append(f"/readyz: {exc}")
            self.slowest = max(self.slowest, time.perf_counter() - started)
            self.stop.wait(0.1)

    def __enter__(self) -> ReadyzSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def _alive(channel: grpc.Channel) -> bool:
    request = grpc_infer_request(random_inputs(8, 8, 64, 1, 2), MODEL)
    channel.unary_unary(SERVICE + "ModelInfer")(request.SerializeToString(), timeout=30)
    return True


def test_a_compressed_message_is_refused_before_it_is_inflated(server: ServerProcess) -> None:
    request = grpc_infer_request(random_inputs(8, 8, 64, 1, 16), MODEL).SerializeToString()
    with _channel(server) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer")
        with pytest.raises(grpc.RpcError) as refused:
            infer(request, timeout=30, compression=grpc.Compression.Gzip)
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "gzip" in (refused.value.details() or "")
        assert _alive(channel)  # the same connection serves an uncompressed call next


def _unknown_fields(size: int) -> bytes:
    """A ModelInferRequest naming a model, then `size` bytes of two-byte unknown fields (field 9, varint 0)."""
    return b"\x0a\x0erope_attention" + b"\x48\x00" * (size // 2)


def _refused_cpu(server: ServerProcess, channel: grpc.Channel, size: int, calls: int) -> float:
    """Server CPU seconds for `calls` concurrent unknown-field messages of `size` bytes, each INVALID_ARGUMENT."""
    data = _unknown_fields(size)
    infer = channel.unary_unary(SERVICE + "ModelInfer")
    before = _cpu_seconds(server.pid)
    futures = [infer.future(data, timeout=60) for _ in range(calls)]
    for future in futures:
        with pytest.raises(grpc.RpcError) as refused:
            future.result()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
        assert "fields" in (refused.value.details() or "")
    return _cpu_seconds(server.pid) - before


def test_a_message_of_tiny_unknown_fields_costs_a_bounded_walk_off_the_loop(server: ServerProcess) -> None:
    with _channel(server) as channel, ReadyzSampler(server) as readyz:
        small = _refused_cpu(server, channel, 4 * MiB, 4)
        large = _refused_cpu(server, channel, 16 * MiB, 4)
        assert _alive(channel)
    assert not readyz.failures, readyz.failures
    assert readyz.slowest < READYZ_LIMIT_SECONDS, readyz.slowest
    # 4 x the bytes: receiving them grows with the size, the walk stops at the field cap. Before the cap the walk
    # was 8.2 s of CPU for one 8 MiB message; 4 x 16 MiB here take well under a second each.
    assert large <= 4 * max(small, 0.05) + 1.0, (small, large)
    assert large < 4 * 2.0, large


def test_the_server_still_serves(server: ServerProcess) -> None:
    with _channel(server) as channel:
        response = pb.ServerReadyResponse.FromString(
            channel.unary_unary(SERVICE + "ServerReady")(b"", timeout=10))
        assert response.ready and _alive(channel)


def _memory(pid: int, field: str) -> int:
    """VmHWM (the peak) or VmRSS of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


# A server whose bound is tight (no table cache), whose budget holds two large reads or one large run at once
TIGHT = {"log_level": "warning", "memory_budget_bytes": 192 * MiB, "max_request_bytes": 24 * MiB, "cache_bytes": 0}


def test_large_unary_messages_are_received_within_the_budget() -> None:
    """24 concurrent ModelInfer calls of 19.5 MiB, each on a connection of its own: gRPC core used to receive every
    one before posenc saw any (about 40 MiB each in core and in Python: some 1 GB, over this server's 576 MiB
    bound); now each read waits for room in the budget, its window at 64 KiB meanwhile. Every call is answered, or
    refused for memory (RESOURCE_EXHAUSTED, at once where every call holding memory waits for more), /readyz answers
    within a second, and the peak stays under the bound."""
    request = grpc_infer_request(random_inputs(8, 8, 64, 13, 256), MODEL).SerializeToString()
    assert 19 * MiB < len(request) < TIGHT["max_request_bytes"]
    bound = memory_bound(Settings(**TIGHT))  # type: ignore[arg-type]
    with ServerProcess(TIGHT, grpc=True) as server, ReadyzSampler(server) as readyz:
        def call(_: int) -> str:
            with _channel(server) as channel:
                try:
                    channel.unary_unary(SERVICE + "ModelInfer")(request, timeout=120)
                    return "OK"
                except grpc.RpcError as exc:
                    return exc.code().name

        with ThreadPoolExecutor(24) as pool:
            codes = list(pool.map(call, range(24)))
        peak = _memory(server.pid, "VmHWM")
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"} and codes.count("OK") >= 2, codes
    assert not readyz.failures, readyz.failures
    assert readyz.slowest < READYZ_LIMIT_SECONDS, readyz.slowest
    assert peak < bound, f"peak {peak / MiB:.0f} MiB over the bound {bound / MiB:.0f} MiB"


async def _push_unread(address: str, request: bytes, streams: int, per_stream: int, seconds: float) -> int:
    """`streams` streams over 8 connections, each writing `per_stream` requests (while gRPC takes them, for at most
    `seconds`) and reading no answer; the writes gRPC took."""
    channels = [grpc.aio.insecure_channel(address, options=[("posenc.test.connection", i)]) for i in range(8)]
    calls = [channels[i % 8].stream_stream(SERVICE + "ModelStreamInfer")(timeout=seconds + 30) for i in range(streams)]
    deadline = time.monotonic() + seconds

    async def write(call: grpc.aio.StreamStreamCall) -> int:
        for sent in range(per_stream):
            try:
                await asyncio.wait_for(call.write(request), max(0.01, deadline - time.monotonic()))
            except (TimeoutError, grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                return sent
        return per_stream

    try:
        return sum(await asyncio.gather(*(write(call) for call in calls)))
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()


def test_unread_streams_hold_a_window_each() -> None:
    """300 streams, each writing 8 requests of 0.38 MiB and reading no answer: with BDP probing, each stream's window
    grew to megabytes and gRPC core took every request, served or not (787 MiB over the ready size here; 4 GB for
    1,000 streams of 12); now a stream holds 64 KiB until posenc reads its next request, and posenc reads only what
    the budget holds and answers no faster than the client reads."""
    request = grpc_infer_request(random_inputs(8, 8, 64, 1, 64), MODEL).SerializeToString()
    with ServerProcess({"log_level": "warning"}, grpc=True) as server:
        ready = _memory(server.pid, "VmRSS")
        sent = asyncio.run(_push_unread(server.grpc_address, request, 300, 8, 12))
        grown = _memory(server.pid, "VmHWM") - ready
        with _channel(server) as channel:
            assert _alive(channel)
    assert sent < 300 * 8, "every request was taken: nothing held the streams back"
    assert grown < 450 * MiB, f"{grown / MiB:.0f} MiB over the ready size for 300 unread streams"
