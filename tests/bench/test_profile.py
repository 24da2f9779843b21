"""The infer benchmark's profile (bench/profile.py): the echo over a bare socket, the phases' medians, and the
split of a latency into client library, transport, server phases and the rest."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from bench.profile import SocketEcho, median_phases, profile_row


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """A loopback server answering each `POST` of N bytes with `x-echo-bytes` bytes, closing after two."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(2):  # the second connection: SocketEcho's again after the first was closed
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
                while len(body) < int(fields[b"Content-Length"]):
                    body += conn.recv(65536)
                answer = bytes(int(fields[b"x-echo-bytes"]))
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(answer) + answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()
    thread.join(10)
    listener.close()


def test_the_socket_echo_reads_the_whole_answer_and_reconnects(echo_server: tuple[str, int]) -> None:
    echo = SocketEcho(*echo_server, body_bytes=300_000, answer_bytes=200_000)
    assert echo.call() == 200_000
    assert echo.call() == 200_000  # the server closed the first connection: a new one
    echo.close()


def test_median_phases_and_a_missing_header() -> None:
    values = iter(["parse;dur=1, run;dur=10", "parse;dur=3, run;dur=30", "parse;dur=2, run;dur=20"])
    assert median_phases(lambda: next(values), 3) == {"parse": 2.0, "run": 20.0}
    with pytest.raises(RuntimeError, match="POSENC_SERVER_TIMING"):
        median_phases(lambda: None, 1)


def test_a_latency_splits_into_its_parts() -> None:
    spans = {"route": 0.25, "parse": 0.5, "queue": 1.0, "run": 40.0, "encode": 0.5, "read": 9.0, "total": 52.0}
    row = profile_row(("m", 8, 512), "HTTP binary", 70.0, 38.0, spans, transport=12.0, client=10.0)
    # client library 10; transport 12; other 70 - 22 - (0.25 + 0.5 + 1 + 40 + 0.5); read overlaps the transport
    assert row == ("| m | 8 | 512 | HTTP binary | 70.00 | 38.00 | 10.00 | 12.00 | 0.25 | 0.00 | 9.00 | 0.50 | 1.00 "
                   "| 40.00 | 0.50 | 5.75 |")
    row = profile_row(("m", 1, 128), "HTTP shm zero-copy", 1.5, 0.5, spans)
    assert row.endswith("| 1.50 | 0.50 | - | - | 0.25 | 0.00 | 9.00 | 0.50 | 1.00 | 40.00 | 0.50 | -40.75 |")
