"""Connection timeouts and shutdown of a real `posenc serve` (service/serving/server.py), over raw sockets.

Timeouts are set small through the environment. The exit-status rule under test: 0 after SIGTERM/SIGINT
when every request in flight at the signal ended within POSENC_GRACEFUL_SHUTDOWN_TIMEOUT (answered, or
ended by its own header/body timeout or by its client); 1 when the graceful timeout had to abort
connections.
"""

from __future__ import annotations

import http.client
import io
import json
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from posenc.service.testing import ServerProcess, http_request, request_head

HEADER_TIMEOUT, BODY_TIMEOUT, KEEP_ALIVE = 1.5, 1.0, 0.5
SLACK = 2.0  # scheduling margin on a busy 2-core machine
T5_PATH = "/v1/t5/bias?query_length=4&key_length=4"


@contextmanager
def running_server(**settings: object) -> Iterator[tuple[ServerProcess, int]]:
    """`posenc serve` on a free port with the short timeouts and `settings`; stopped at the end if still running."""
    timeouts = {"log_level": "warning", "header_timeout": HEADER_TIMEOUT, "body_timeout": BODY_TIMEOUT,
                "timeout_keep_alive": KEEP_ALIVE}
    with ServerProcess({**timeouts, **settings}, ready="/readyz", ready_timeout=60) as server:
        yield server, server.port


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    body = response.read()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def weight_npy() -> bytes:
    """A valid `POST /v1/t5/bias` body: weight [num_buckets=32, heads=2]."""
    buffer = io.BytesIO()
    np.save(buffer, np.arange(64, dtype=np.float32).reshape(32, 2))
    return buffer.getvalue()


def seconds_until_closed(sock: socket.socket) -> tuple[float, bytes]:
    """Seconds until the server closes `sock` (EOF or reset), and what it sent before."""
    start, received = time.monotonic(), b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return time.monotonic() - start, received


def stop(proc: ServerProcess, sig: int = signal.SIGTERM, within: float = 10.0) -> tuple[int, float]:
    start = time.monotonic()
    proc.send_signal(sig)
    return proc.wait(within), time.monotonic() - start


# -- timeouts while serving (one server)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with running_server() as (_, port):
        yield port


@pytest.mark.timeout(30)
@pytest.mark.parametrize("sent", [b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", b""],
                         ids=["partial-head", "nothing"])
def test_incomplete_request_head_is_closed_after_the_header_timeout(port: int, sent: bytes) -> None:
    with connect(port) as sock:
        sock.sendall(sent)
        elapsed, received = seconds_until_closed(sock)
    assert received == b""
    assert HEADER_TIMEOUT - 0.2 <= elapsed <= HEADER_TIMEOUT + SLACK


@pytest.mark.timeout(30)
def test_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(request_head("GET", "/healthz"))
        status, headers, _ = read_response(sock)
        assert status == 200 and headers.get("connection") != "close"
        elapsed, received = seconds_until_closed(sock)
    assert received == b""
    assert KEEP_ALIVE - 0.2 <= elapsed <= KEEP_ALIVE + SLACK < HEADER_TIMEOUT + SLACK


@pytest.mark.timeout(30)
def test_stalled_body_gets_408_and_the_server_keeps_serving(port: int) -> None:
    body = weight_npy()
    with connect(port) as stalled:
        stalled.sendall(request_head("POST", T5_PATH, len(body), Content_Type="application/x-npy") + body[:50])
        start = time.monotonic()
        assert http_request(port, "/healthz")[0] == 200  # served while the other body stalls
        status, headers, answer = read_response(stalled)
        elapsed = time.monotonic() - start
    assert status == 408 and headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    assert json.loads(answer)["type"] == "request_timeout"
    assert "POSENC_BODY_TIMEOUT" in json.loads(answer)["error"]
    assert BODY_TIMEOUT - 0.2 <= elapsed <= BODY_TIMEOUT + SLACK
    assert http_request(port, T5_PATH, "POST", body, {"Content-Type": "application/x-npy"})[0] == 200


@pytest.mark.timeout(30)
def test_trickled_body_within_the_gap_is_answered(port: int) -> None:
    body = weight_npy()
    with connect(port) as sock:
        sock.sendall(request_head("POST", T5_PATH, len(body), Content_Type="application/x-npy"))
        for start in range(0, len(body), len(body) // 4 + 1):  # ~4 pieces, each gap under the body timeout
            time.sleep(BODY_TIMEOUT / 2)
            sock.sendall(body[start:start + len(body) // 4 + 1])
        assert read_response(sock)[0] == 200


# -- shutdown (a server each)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_without_traffic_exits_0_promptly(sig: int) -> None:
    graceful = 10.0
    with running_server(graceful_shutdown_timeout=graceful) as (proc, _):
        status, elapsed = stop(proc, sig, within=graceful + SLACK + 5)
    assert status == 0
    assert elapsed < graceful  # nothing in flight: the graceful timeout is not waited out


@pytest.mark.timeout(60)
def test_sigterm_lets_a_slow_upload_finish_and_exits_0() -> None:
    body = weight_npy()
    with running_server(graceful_shutdown_timeout=10) as (proc, port), connect(port) as sock:
        sock.sendall(request_head("POST", T5_PATH, len(body), Content_Type="application/x-npy") + body[:40])
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the server is draining: the upload goes on, within the body timeout
        sock.sendall(body[40:])
        status, headers, _ = read_response(sock)
        assert status == 200 and headers["connection"] == "close"  # no keep-alive while shutting down
        assert proc.wait(10) == 0


@pytest.mark.timeout(60)
def test_sigterm_with_a_stalled_body_answers_408_and_exits_0() -> None:
    """The body timeout (1 s) ends the request before the graceful timeout (10 s): nothing is cut."""
    body = weight_npy()
    with running_server(graceful_shutdown_timeout=10) as (proc, port), connect(port) as sock:
        sock.sendall(request_head("POST", T5_PATH, len(body), Content_Type="application/x-npy") + body[:40])
        time.sleep(0.3)
        status, elapsed = stop(proc, within=BODY_TIMEOUT + SLACK + 5)
        assert read_response(sock)[0] == 408
    assert status == 0
    assert elapsed < 10


@pytest.mark.timeout(60)
def test_sigterm_cuts_a_trickling_upload_at_the_graceful_timeout_and_exits_1() -> None:
    """A client that keeps the body coming (each gap under the body timeout) is cut at the graceful timeout."""
    graceful = 2.0
    body = weight_npy()
    with running_server(graceful_shutdown_timeout=graceful, body_timeout=30) as (proc, port), \
            connect(port) as sock:
        sock.sendall(request_head("POST", T5_PATH, len(body), Content_Type="application/x-npy") + body[:40])
        time.sleep(0.3)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(OSError):  # broken pipe / reset once the server aborts the connection
            for offset in range(40, len(body)):
                sock.sendall(body[offset:offset + 1])
                time.sleep(0.2)
        status = proc.wait(graceful + SLACK + 5)
        elapsed = time.monotonic() - start
    assert status == 1
    assert graceful <= elapsed <= graceful + SLACK + 3


@pytest.mark.timeout(60)
def test_sigterm_cuts_a_download_the_client_stopped_reading_and_exits_1() -> None:
    graceful = 2.0
    with running_server(graceful_shutdown_timeout=graceful) as (proc, port):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        with sock:
            sock.sendall(request_head("GET", "/v1/sinusoidal?max_position=32768&dim=256&format=raw"))
            time.sleep(1.0)  # the server has computed the table and fills the socket; nobody reads
            status, elapsed = stop(proc, within=graceful + SLACK + 5)
    assert status == 1
    assert graceful <= elapsed <= graceful + SLACK + 3
