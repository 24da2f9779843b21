"""The test kit itself (posenc.service.testing): its KServe requests agree with the service's codec for every dtype,
its load is bounded, stays on loopback and keeps its connections or opens one per request, its servers report a
failed start and are stopped within a bound."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from urllib.parse import urlsplit

import numpy as np
import pytest

from posenc.models.dtypes import DTYPES, DType
from posenc.service.inference.codecs.kserve_request import InferRequest, RequestedOutput, parse_infer_request
from posenc.service.inference.codecs.kserve_response import encode_infer_response
from posenc.service.testing import (
    LOOPBACK,
    HttpRequest,
    LoadGenerator,
    LoadResult,
    ServerProcess,
    decode_response,
    kserve_request,
)
from posenc.service.testing.http import http_request


def _array(dtype: np.dtype) -> np.ndarray:
    return (np.arange(6) % 2 == 1).reshape(2, 3) if dtype == np.bool_ else np.arange(6).astype(dtype).reshape(2, 3)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("row", DTYPES, ids=[row.name for row in DTYPES])
def test_requests_and_responses_agree_with_the_service_codec(row: DType, binary: bool) -> None:
    array = _array(row.numpy)
    request = kserve_request({"x": array}, binary=binary, request_id="r")
    parsed = parse_infer_request(request.body, request.headers.get("Inference-Header-Content-Length"))
    assert parsed.id == "r" and parsed.inputs[0].array.dtype == array.dtype
    np.testing.assert_array_equal(parsed.inputs[0].array, array)
    body, headers = encode_infer_response("m", "1", InferRequest(id="r", inputs=[], outputs=None,
                                                                 binary_output=binary), {"y": array}, ["y"])
    decoded = decode_response(body, headers)
    assert decoded.outputs["y"].dtype == array.dtype
    np.testing.assert_array_equal(decoded.outputs["y"], array)


def test_decoder_refuses_binary_sections_that_do_not_add_up() -> None:
    body, headers = encode_infer_response("m", "1", InferRequest(id=None, inputs=[], outputs=[RequestedOutput(
        "y", True)], binary_output=False), {"y": np.arange(4, dtype=np.float32)}, ["y"])
    with pytest.raises(ValueError, match="the body has"):
        decode_response(body + b"\0", headers)
    with pytest.raises(ValueError, match="pass the end of the body"):
        decode_response(body[:-1], headers)


def test_load_is_bounded_and_stays_on_loopback() -> None:
    with pytest.raises(ValueError, match="bounded"):
        LoadGenerator(80)
    with pytest.raises(ValueError, match="not a loopback address"):
        LoadGenerator(80, host="192.0.2.1", seconds=1)
    with pytest.raises(ValueError, match="seconds"):
        LoadGenerator(80, seconds=10**6)


@pytest.mark.timeout(60)
def test_load_counts_every_answer_and_stops_at_the_count(server: str) -> None:
    port = urlsplit(server).port or 0
    plan = [HttpRequest(path="/healthz"), HttpRequest(path="/no/such/route")]
    seen: list[int | None] = []
    result = LoadGenerator(port, connections=2, requests=20).run(plan, lambda outcome: seen.append(outcome.status))
    assert result.requests == len(seen) == 20
    assert result.statuses == {200: 10, 404: 10} and result.errors == 10 and result.socket_errors == 0


@pytest.mark.timeout(60)
def test_load_over_a_new_connection_per_request() -> None:
    async def scenario(new_connections: bool) -> tuple[int, LoadResult]:
        accepted = 0

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            try:
                while await reader.readuntil(b"\r\n\r\n"):  # keep-alive: as many requests as the client sends
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(answer, LOOPBACK, 0)
        async with server:
            load = LoadGenerator(server.sockets[0].getsockname()[1], connections=2, requests=10,
                                 new_connections=new_connections)
            result = await load.run_async(HttpRequest(path="/"))
        return accepted, result

    for new_connections, connections in ((False, 2), (True, 10)):
        accepted, result = asyncio.run(scenario(new_connections))
        assert (result.requests, result.errors, accepted) == (10, 0, connections)


@pytest.mark.timeout(60)
def test_a_failed_start_says_why_with_the_log() -> None:
    with pytest.raises(RuntimeError, match="POSENC_CACHE_BYTES") as info:
        ServerProcess({"cache_bytes": "lots"}, ready_timeout=30).start()
    assert "exited with 2" in str(info.value)


@pytest.mark.timeout(60)
def test_a_server_that_ignores_sigterm_is_killed_after_the_bound() -> None:
    ignore = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
              "time.sleep(60)")
    server = ServerProcess(command=[sys.executable, "-c", ignore], ready=None, stop_timeout=1).start()
    while "up" not in server.log():  # the handler is in place
        assert server.poll() is None
        time.sleep(0.05)
    assert server.stop() == -signal.SIGKILL
    assert server.log() == "up\n"


@pytest.mark.timeout(120)
def test_a_port_another_process_took_first_is_chosen_again() -> None:
    """A CI run: the port a server was given was another worker's gRPC port by the time it bound it; its readiness
    probe read that server's HTTP/2 preface and failed the test (http.client.BadStatusLine). Here another
    "server" takes the chosen port first and answers every connection with an HTTP/2 SETTINGS frame: the probe
    waits, the server exits for the port in use, and it starts again on a fresh port."""
    import socket
    import threading

    server = ServerProcess({"log_level": "warning"}, ready_timeout=60)
    taken = server.port
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind((LOOPBACK, taken))
    squatter.listen(16)
    settings_frame = bytes.fromhex("000000040000000000")  # a gRPC server's first bytes

    def answer() -> None:
        with contextlib.suppress(OSError):
            while True:
                peer, _ = squatter.accept()
                with peer:
                    peer.sendall(settings_frame)

    threading.Thread(target=answer, daemon=True).start()
    try:
        with server:
            assert server.port != taken and "address already in use" not in server.log().lower()
            assert http_request(server.port, "/readyz")[0] == 200
    finally:
        squatter.close()
