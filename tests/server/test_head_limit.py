"""POSENC_MAX_HEADER_BYTES on a real server: a request head over the limit gets 431 and its connection is
closed as soon as the limit is passed (a 64 MiB header is not read to its end); heads under it are served."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from posenc.service.testing import ServerProcess, http_request

LIMIT = 16 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess({"max_header_bytes": LIMIT, "log_level": "warning"}) as process:
        yield process


def _send_head(port: int, header_bytes: int, chunk: int = 64 * 1024) -> tuple[bytes, int]:
    """Send a GET whose one header is `header_bytes` long, in chunks, until the server answers or closes:
    (what it answered, how many bytes were sent by then)."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /v1/alibi/slopes?num_heads=8 HTTP/1.1\r\nHost: x\r\nX-Junk: ")
        try:
            while sent < header_bytes:
                piece = b"j" * min(chunk, header_bytes - sent)
                sock.sendall(piece)
                sent += len(piece)
            sock.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        sock.settimeout(30)
        answer = b""
        try:
            while chunk_read := sock.recv(65536):
                answer += chunk_read
                if b"\r\n\r\n" in answer and b'"type"' in answer and answer.rstrip().endswith(b"}"):
                    break
        except ConnectionResetError:
            pass
    return answer, sent


def test_a_head_over_the_limit_is_431_and_cut_early(server: ServerProcess) -> None:
    answer, sent = _send_head(server.port, 64 << 20)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), answer[:200]
    document = json.loads(body)
    assert document["type"] == "request_header_fields_too_large" and str(LIMIT) in document["error"]
    assert sent < 64 << 20  # the server closed long before the 64 MiB were sent
    assert http_request(server.port, "/healthz")[0] == 200


def test_a_head_under_the_limit_is_served(server: ServerProcess) -> None:
    status, _, _ = http_request(server.port, "/v1/alibi/slopes?num_heads=8", headers={"X-Junk": "j" * (LIMIT // 2)})
    assert status == 200


def test_bodies_do_not_count_as_head(server: ServerProcess) -> None:
    """A whole request (head and a body six times the limit) in one read, twice on one connection: served."""
    from posenc.service.testing import RequestedOutput, attention_inputs, kserve_request, request_bytes

    request = kserve_request(attention_inputs(8, 8, 64, 1, 16), outputs=[RequestedOutput("output", binary=True)])
    assert len(request.body) > 6 * LIMIT
    raw = request_bytes("POST", "/v2/models/rope_attention/infer", request.body, request.headers)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        for _ in range(2):
            sock.sendall(raw)
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(65536)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(body) < length:
                body += sock.recv(65536)


def test_a_head_over_the_limit_in_one_read_is_431(server: ServerProcess) -> None:
    """A head a little over the limit, sent in one piece (the parser sees it whole before any count)."""
    head = b"GET /v1/alibi/slopes?num_heads=8 HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"j" * (LIMIT + 1024) + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
