"""The protocol's limits at their edges, on a real server: a head of exactly POSENC_MAX_HEADER_BYTES is
served (one byte more is a 431), an idle kept-alive connection outlives a shorter header timeout, and a
client that paused reading and resumed is not cut by the send timeout afterwards."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest

from posenc.service.testing import ServerProcess, request_bytes

LIMIT = 16 * 1024
HEADER_TIMEOUT = 0.5
KEEP_ALIVE = 10.0
SEND_TIMEOUT = 1.0
URL = "/v1/alibi/slopes?num_heads=8"
BIG = "/v1/alibi/bias?num_heads=16&query_length=512&key_length=512&format=raw"  # 16 MiB


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    settings = {"max_header_bytes": LIMIT, "header_timeout": HEADER_TIMEOUT, "timeout_keep_alive": KEEP_ALIVE,
                "send_timeout": SEND_TIMEOUT, "cache_bytes": 0, "log_level": "warning"}
    with ServerProcess(settings) as process:
        yield process


def _answer(sock: socket.socket) -> tuple[int, int]:
    """Status and body length of the next response on `sock`, its body read to its Content-Length and no further
    (a pipelined answer behind it stays unread); (0, bytes read) when the connection was closed instead."""
    head, received = b"", 0
    try:
        while not head.endswith(b"\r\n\r\n"):
            byte = sock.recv(1)
            if not byte:
                return 0, 0
            head += byte
        lines = head.decode("latin-1").split("\r\n")
        length = next((int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")), 0)
        while received < length:
            chunk = sock.recv(min(1 << 20, length - received))
            if not chunk:
                return 0, received
            received += len(chunk)
    except (ConnectionResetError, TimeoutError):
        return 0, received
    return int(lines[0].split()[1]), received


def _status(sock: socket.socket) -> int:
    """The status of the next response on `sock` (read whole); 0 when the connection was closed instead."""
    return _answer(sock)[0]


# --- a head of exactly the limit ---------------------------------------------------------------------------------


def _head_parsed_as(size: int) -> bytes:
    """A head whose size as the server counts it once parsed (the URL, and each header's name and value plus
    4) is `size`."""
    fixed = len(URL) + (4 + 1 + 4) + (6 + 4)  # the URL, "Host: x", "X-Junk: ..."
    return f"GET {URL} HTTP/1.1\r\nHost: x\r\nX-Junk: {'j' * (size - fixed)}\r\n\r\n".encode()


@pytest.mark.parametrize(("size", "status"), [(LIMIT, 200), (LIMIT + 1, 431)])
def test_a_head_in_one_read_at_the_limit(server: ServerProcess, size: int, status: int) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(_head_parsed_as(size))
        assert _status(sock) == status


@pytest.mark.parametrize(("size", "status"), [(LIMIT, 200), (LIMIT + 1, 431)])
def test_a_head_growing_in_pieces_up_to_the_limit(server: ServerProcess, size: int, status: int) -> None:
    """`size` bytes of an unfinished head (counted as they arrive), then its end."""
    start = f"GET {URL} HTTP/1.1\r\nHost: x\r\nX-Junk: ".encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(start + b"j" * (size - len(start)))
        time.sleep(0.2)  # read on its own: the head is still growing
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"\r\n\r\n")
        assert _status(sock) == status


# --- timers ----------------------------------------------------------------------------------------------------------


def test_an_idle_connection_outlives_a_shorter_header_timeout(server: ServerProcess) -> None:
    """Keep-alive (10 s) longer than the header timeout (0.5 s): between two requests the connection is
    idle, not a head that is late, and stays open for the keep-alive."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request_bytes("GET", URL))
        assert _status(sock) == 200
        time.sleep(4 * HEADER_TIMEOUT)
        sock.sendall(request_bytes("GET", URL))
        assert _status(sock) == 200


def test_a_client_that_paused_and_resumed_reading_is_not_cut_later(server: ServerProcess) -> None:
    """A 16 MiB answer that the client leaves unread for half the send timeout, then reads whole: the send
    timer stopped when it resumed, so the connection is still there well past the send timeout."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(request_bytes("GET", BIG))
        time.sleep(SEND_TIMEOUT / 2)  # 16 MiB is more than the sockets hold: the server pauses writing
        assert _status(sock) == 200
        time.sleep(2 * SEND_TIMEOUT)
        sock.sendall(request_bytes("GET", URL))
        assert _status(sock) == 200


def test_a_pipelined_body_waiting_for_its_turn_is_not_timed_out() -> None:
    """Request B's head and part of its body arrive behind request A, an uncached 128 MiB table that takes the
    server several body timeouts to compute; the rest of B's body comes at once but waits in the socket, since
    the server stops reading while A runs. That silence is the server's own: no 408, A arrives whole, then B's
    own answer."""
    body_timeout = 0.1
    settings = {"body_timeout": body_timeout, "send_timeout": 60.0, "cache_bytes": 0, "log_level": "warning"}
    table = "/v1/alibi/bias?num_heads=32&query_length=1024&key_length=1024&format=raw"  # 128 MiB
    body = json.dumps({"inputs": [{"name": "query", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).encode()
    second = request_bytes("POST", "/v2/models/rope_attention/infer", body, {"Content-Type": "application/json"})
    with ServerProcess(settings) as server, socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(request_bytes("GET", table) + second[:-20])
        time.sleep(body_timeout / 5)
        sock.sendall(second[-20:])
        assert _answer(sock) == (200, 128 << 20)
        assert _status(sock) == 400  # the inference's own answer (inputs missing), not a 408
