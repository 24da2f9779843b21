"""Response bodies stay counted in the memory budget until the kernel has them (a real server: the protocol
releases them). Clients that ask for 64 MiB tables and read nothing keep their bodies' bytes in the budget,
so a new request that needs more than is left waits, then gets the 503 of the budget; closing the readers'
connections gives the bytes back. A cached body sent to many clients is counted once."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from posenc.service.testing import ServerProcess, http_request, request_bytes

MiB = 1 << 20
TABLE = "/v1/alibi/bias?num_heads=16&query_length=1024&key_length=1024&format=raw&alibi_bias_max={:.2f}"  # 64 MiB
READERS = 6  # 6 x 64 MiB held, and a new table's 192 MiB of working memory do not fit in 512 MiB


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    settings = {"memory_budget_bytes": 512 * MiB, "memory_wait_seconds": 5, "cache_bytes": 200 * MiB,
                "send_timeout": 120, "timeout_keep_alive": 120, "log_level": "warning"}
    with ServerProcess(settings, ready="/readyz", ready_timeout=60) as process:
        yield process


def _slow_reader(stack: ExitStack, port: int, path: str) -> socket.socket:
    """A connection that asks for `path` and reads nothing (small receive buffer: the body stays with us)."""
    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(request_bytes("GET", path))
    return sock


def _wait_answered(socks: list[socket.socket], timeout: float = 60) -> None:
    """Until each connection has the start of its response (a status line waits in its receive buffer)."""
    deadline = time.monotonic() + timeout
    for sock in socks:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        head = sock.recv(12, socket.MSG_PEEK)
        assert head.startswith(b"HTTP/1.1 200"), head


def _status(port: int, value: float) -> tuple[int, bytes]:
    status, _, body = http_request(port, TABLE.format(value), timeout=60)
    return status, body


def test_bodies_unread_stay_in_the_budget_until_their_connections_close(server: ServerProcess) -> None:
    with ExitStack() as stack:
        readers = [_slow_reader(stack, server.port, TABLE.format(8 - i * 0.01)) for i in range(READERS)]
        _wait_answered(readers)
        status, body = _status(server.port, 5.0)
        assert status == 503, (status, body[:200])  # before: 200 (the bodies had left the budget)
        assert b"POSENC_MEMORY_BUDGET_BYTES" in body
    time.sleep(0.5)  # the connections are closed: the server sees them go
    assert _status(server.port, 5.01)[0] == 200


def test_a_body_read_to_the_end_leaves_the_budget(server: ServerProcess) -> None:
    for i in range(READERS + 2):  # each read whole: never more than one held at a time
        status, body = _status(server.port, 6 - i * 0.01)
        assert status == 200 and len(body) == 64 * MiB


def test_a_cached_body_sent_to_many_readers_is_counted_once(server: ServerProcess) -> None:
    assert _status(server.port, 4.0)[0] == 200  # computed and cached
    with ExitStack() as stack:
        readers = [_slow_reader(stack, server.port, TABLE.format(4.0)) for _ in range(READERS)]
        _wait_answered(readers)
        assert _status(server.port, 3.0)[0] == 200  # 64 MiB held once, not six times
