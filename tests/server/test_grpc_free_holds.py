"""Nothing a gRPC client sends for free holds what others need (issue 62), against a real `posenc serve`, measured
from outside: other clients' answers, the server's memory (VmRSS, VmHWM) and CPU time from /proc.

* ModelInfer calls that send their headers and no message, from a process running as uid 65534 (raw HTTP/2: no
  client library in between), each on a connection of its own: HTTP tables and inferences are all answered 200,
  /readyz within a second, and the server spends neither memory nor CPU on the calls. Each such call used to hold
  2 x POSENC_MAX_REQUEST_BYTES of the memory budget for up to 94 s: 8 of them held all of it, and every HTTP
  request waited for memory and got a 503.
* Streams of one large request each: every message is counted in the budget before it is read, so the peak stays
  under the documented bound; it used to be received whole first (24 streams of 60 MiB peaked at 1.9 GB).
* A message to a server with no model ready is refused before it is read.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import select
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2 as pb

from posenc.service.budget import memory_bound
from posenc.service.settings import Settings
from posenc.service.testing import ServerProcess, kserve_request
from tests.onnx_models import REPOSITORY, grpc_infer_request, random_inputs
from tests.server.test_grpc_doors import READYZ_LIMIT_SECONDS, ReadyzSampler, _cpu_seconds, _memory

MODEL = "rope_attention"
SERVICE = "/inference.GRPCInferenceService/"
MiB = 1024 * 1024
NOBODY = 65534
TABLE = "/v1/sinusoidal?max_position=1024&dim=512&format=npy"  # 2 MiB of float32
# A shorter memory wait than the default 10 s, so that a request kept from memory shows as a 503 within the test
QUICK = {"log_level": "warning", "memory_wait_seconds": 2}


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK header field, literal and not indexed (names and values under 127 bytes)."""
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def silent_call(port: int) -> socket.socket:
    """A connection that starts a ModelInfer call, its headers and nothing else, as any HTTP/2 client can."""
    headers = b"".join(_literal(name, value) for name, value in [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", f"{SERVICE}ModelInfer".encode()),
        (b":authority", b"127.0.0.1"), (b"content-type", b"application/grpc"), (b"te", b"trailers")])
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(4, 0, 0) + _frame(4, 1, 0) + _frame(1, 4, 1, headers))
    return sock


@contextmanager
def silent_calls_as_nobody(port: int, calls: int) -> Iterator[int]:
    """`calls` silent ModelInfer calls held open by a forked child running as uid 65534, until the block ends.
    Yields the child's uid as it reported it (skips the test where it cannot drop to 65534)."""
    ready_read, ready_write = os.pipe()
    stop_read, stop_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(ready_read)
            os.close(stop_write)
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                held = [silent_call(port) for _ in range(calls)]
                os.write(ready_write, f"{os.geteuid()}".encode())
            except PermissionError as exc:
                os.write(ready_write, f"no {exc}".encode())
                held = []
            while not select.select([stop_read, *held], [], [], 1.0)[0].count(stop_read):
                for sock in select.select(held, [], [], 0)[0]:
                    if not sock.recv(1 << 16):  # the server ended the connection: nothing more to hold
                        held.remove(sock)
            status = 0
        finally:
            os._exit(status)
    os.close(ready_write)
    os.close(stop_read)
    try:
        said = os.read(ready_read, 200).decode()
        if said.startswith("no "):
            pytest.skip(f"cannot run as uid {NOBODY}: {said[3:]}")
        yield int(said)
    finally:
        os.close(stop_write)
        os.close(ready_read)
        _, wait_status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(wait_status) == 0


def _http_clients(port: int, stop: threading.Event, answers: Counter[str]) -> list[threading.Thread]:
    """A client asking for a 2 MiB table and one posting a 148 KB inference, again and again until `stop`."""
    infer = kserve_request(random_inputs(8, 8, 64, 1, 24))
    asks = {"table": ("GET", TABLE, None, {}),
            "infer": ("POST", f"/v2/models/{MODEL}/infer", infer.body, infer.headers)}

    def loop(kind: str) -> None:
        method, path, body, headers = asks[kind]
        while not stop.is_set():
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                connection.request(method, path, body, headers)
                response = connection.getresponse()
                response.read()
                answers[f"{kind} {response.status}"] += 1
            except OSError as exc:
                answers[f"{kind} {type(exc).__name__}"] += 1
            finally:
                connection.close()
            stop.wait(0.05)

    return [threading.Thread(target=loop, args=(kind,), daemon=True) for kind in asks]


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to uid 65534 needs root")
@pytest.mark.parametrize("calls", [8, 32])
def test_calls_that_send_nothing_leave_http_served(calls: int) -> None:
    with ServerProcess(QUICK, grpc=True) as server:
        ready = _memory(server.pid, "VmRSS")
        with silent_calls_as_nobody(server.grpc_port, calls) as uid:
            assert uid == NOBODY
            time.sleep(1.0)  # every call reaches its handler
            cpu = _cpu_seconds(server.pid)
            time.sleep(3.0)  # nothing but the calls: the server does not work for them
            idle_cpu = _cpu_seconds(server.pid) - cpu
            held = _memory(server.pid, "VmRSS") - ready
            stop, answers = threading.Event(), Counter[str]()
            clients = _http_clients(server.port, stop, answers)
            with ReadyzSampler(server) as readyz:
                for client in clients:
                    client.start()
                time.sleep(8.0)  # four memory waits (POSENC_MEMORY_WAIT_SECONDS=2): a 503 had time to show
                stop.set()
                for client in clients:
                    client.join()
        assert server.poll() is None
    assert set(answers) == {"table 200", "infer 200"}, answers
    assert not readyz.failures, readyz.failures
    assert readyz.slowest < READYZ_LIMIT_SECONDS, readyz.slowest
    assert idle_cpu < 1.0, f"{idle_cpu:.2f} s of CPU in 3 s for {calls} calls that send nothing"
    assert held < 64 * MiB, f"{held / MiB:.0f} MiB resident for {calls} calls that send nothing"


# A server whose bound is tight (no table cache), whose budget holds two 24 MiB messages being received at once
TIGHT = {"log_level": "warning", "memory_budget_bytes": 192 * MiB, "max_request_bytes": 24 * MiB, "cache_bytes": 0}


async def _large_streams(address: str, data: bytes, streams: int, connections: int) -> Counter[str]:
    """`streams` streams over `connections` connections, each sending `data` once and reading its answer."""
    channels = [grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", -1),
                                                            ("posenc.test.connection", i)])
                for i in range(connections)]

    async def one(index: int) -> str:
        call = channels[index % connections].stream_stream(SERVICE + "ModelStreamInfer")(iter([data]), timeout=120)
        try:
            answers = [pb.ModelStreamInferResponse.FromString(answer) async for answer in call]
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        errors = [answer.error_message for answer in answers if answer.error_message]
        return "busy" if errors and errors[0].startswith("busy") else errors[0] if errors else f"OK x{len(answers)}"

    try:
        return Counter(await asyncio.gather(*(one(i) for i in range(streams))))
    finally:
        for channel in channels:
            await channel.close()


@pytest.mark.parametrize("streams", [24, 48])
def test_streams_of_large_requests_are_counted_before_they_are_read(streams: int) -> None:
    """Streams of one 19.5 MiB request each: every one used to be received whole before it was counted (about
    40 MiB each in gRPC core and in Python: 24 streams peaked over this server's 576 MiB bound); now each is read
    once the budget holds it. Each request is answered (or refused for memory in its own answer), /readyz answers
    within a second, and the peak stays under the bound."""
    data = grpc_infer_request(random_inputs(8, 8, 64, 13, 256), MODEL).SerializeToString()
    assert 19 * MiB < len(data) < TIGHT["max_request_bytes"]
    bound = memory_bound(Settings(**TIGHT))  # type: ignore[arg-type]
    with ServerProcess(TIGHT, grpc=True) as server, ReadyzSampler(server) as readyz:
        answers = asyncio.run(_large_streams(server.grpc_address, data, streams, 8))
        peak = _memory(server.pid, "VmHWM")
    assert set(answers) <= {"OK x1", "busy"} and answers["OK x1"] >= 2, answers
    assert not readyz.failures, readyz.failures
    assert readyz.slowest < READYZ_LIMIT_SECONDS, readyz.slowest
    assert peak < bound, f"peak {peak / MiB:.0f} MiB over the bound {bound / MiB:.0f} MiB ({answers})"


def test_a_message_for_a_server_with_no_model_ready_is_not_read(tmp_path: Path) -> None:
    """A 48 MiB ModelInfer to a server whose only model failed: UNAVAILABLE naming why, before the message is read
    (it used to be read, twice in memory, and parsed before it was refused)."""
    repository = tmp_path / "models"
    shutil.copytree(REPOSITORY / MODEL, repository / "broken")
    (repository / "broken" / "config.json").write_text("{not json")
    data = grpc_infer_request(random_inputs(8, 8, 64, 32, 256), "broken").SerializeToString()
    assert len(data) > 48 * MiB
    settings = {"log_level": "warning", "model_repository": str(repository)}
    with ServerProcess(settings, grpc=True, ready="/healthz") as server:
        before, cpu = _memory(server.pid, "VmHWM"), _cpu_seconds(server.pid)
        options = [("grpc.max_send_message_length", -1)]
        with grpc.insecure_channel(server.grpc_address, options=options) as channel, \
                pytest.raises(grpc.RpcError) as refused:
            channel.unary_unary(SERVICE + "ModelInfer")(data, timeout=60)
        grown, spent = _memory(server.pid, "VmHWM") - before, _cpu_seconds(server.pid) - cpu
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value.details()
    assert grown < 16 * MiB, f"the server grew {grown / MiB:.0f} MiB for a message it refused"
    assert spent < 1.0, f"{spent:.2f} s of CPU for a message it refused"
    assert (refused.value.details() or "").startswith("not ready: "), refused.value.details()
