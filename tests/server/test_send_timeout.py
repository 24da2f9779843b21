"""POSENC_SEND_TIMEOUT on a real server: a client that asks for a 64 MiB table and reads nothing has its
connection cut after the timeout (its response no longer held), and /metrics counts the cut."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import pytest

from posenc.service.testing import ServerProcess, http_request, request_bytes

TIMEOUT = 1.5
BIG = "/v1/alibi/bias?num_heads=16&query_length=1024&key_length=1024&format=raw&alibi_bias_max=7.5"  # 64 MiB


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # keep-alive shorter than the send timeout: the keep-alive timer asks for a close first, and a close
    # waits for a buffer that never drains, so only the send timeout can end the connection
    settings = {"send_timeout": TIMEOUT, "timeout_keep_alive": 0.5, "log_level": "warning", "cache_bytes": 0}
    with ServerProcess(settings) as process:
        yield process


def _cuts(port: int) -> float:
    text = http_request(port, "/metrics")[2].decode()
    match = re.search(r"^posenc_send_timeouts_total (\S+)", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_client_that_reads_nothing_is_cut(server: ServerProcess) -> None:
    before = _cuts(server.port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(request_bytes("GET", BIG))
        deadline = time.monotonic() + 30 + TIMEOUT
        while _cuts(server.port) == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _cuts(server.port) == before + 1
        sock.settimeout(10)
        received = 0
        with pytest.raises((ConnectionResetError, TimeoutError)):
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
            raise ConnectionResetError  # the stream ended early: also a cut
        assert received < 64 << 20
    assert http_request(server.port, "/healthz")[0] == 200


def test_a_client_that_reads_is_served_whole(server: ServerProcess) -> None:
    status, _, body = http_request(server.port, BIG.replace("7.5", "7.25"), timeout=60)
    assert status == 200 and len(body) == 64 << 20
