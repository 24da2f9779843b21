"""Refusals given before a body is read reach the client as a status, not a reset (`posenc.service.http.protocol`'s
lingering close): many clients at once, each sending its whole over-limit body before reading, on connections that
close after the answer (`Connection: close`, HTTP/1.0), each get their 413. Closed at once, the server's socket
held the unread body and the kernel answered it with a reset, which such a client meets before the answer (every
one of 256 uploads, 64 at once). The drop of the rest of the body is bounded: in bytes, and in time without a byte."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from posenc.service.http.protocol import LINGER_BYTES, LINGER_GAP_SECONDS
from posenc.service.testing import ServerProcess, request_head

MiB = 1 << 20
LIMIT = 1 * MiB  # POSENC_MAX_REQUEST_BYTES: the 8 MiB uploads are over it
UPLOAD = 8 * MiB
CLIENTS = 32
CHECK = "/v1/check/alibi/bias?num_heads=8&query_length=512&key_length=512"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess({"log_level": "warning", "max_request_bytes": LIMIT, "access_log": False}) as process:
        yield process


def upload(port: int, version: str, close: bool) -> str:
    """Send the whole over-limit upload, then read the answer: its status, or the error met."""
    head = request_head("POST", CHECK, UPLOAD, Content_Type="application/octet-stream",
                        **({"Connection": "close"} if close else {}))
    if version != "1.1":
        head = head.replace(b" HTTP/1.1\r\n", f" HTTP/{version}\r\n".encode(), 1)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(head + bytes(UPLOAD))
            response = http.client.HTTPResponse(sock)
            response.begin()
            document = json.loads(response.read())
            return f"{response.status} {document['type']}"
    except OSError as exc:
        return type(exc).__name__


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("version", "close"), [("1.1", True), ("1.0", False)], ids=["connection-close", "http-1.0"])
def test_every_client_of_a_crowd_gets_its_413(server: ServerProcess, version: str, close: bool) -> None:
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def client() -> None:
        for _ in range(2):
            outcome = upload(server.port, version, close)
            with lock:
                outcomes[outcome] += 1

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == {"413 too_large": 2 * CLIENTS}


@pytest.mark.timeout(120)
def test_the_drop_of_an_unread_body_is_bounded_in_bytes(server: ServerProcess) -> None:
    """A client that keeps sending after its answer is cut once the server has dropped LINGER_BYTES: it gets the 413
    first (our FIN follows it), then the connection ends."""
    declared = 16 * LINGER_BYTES
    sent = 0
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(request_head("POST", CHECK, declared, Content_Type="application/octet-stream", Connection="close"))
        chunk = bytes(MiB)
        with pytest.raises(OSError):  # broken pipe or reset: the server stopped reading
            while sent < declared:
                sock.sendall(chunk)
                sent += len(chunk)
    # what the kernels' buffers took beyond the bound is far less than the body declared
    assert LINGER_BYTES <= sent < 2 * LINGER_BYTES < declared


@pytest.mark.timeout(120)
def test_a_client_that_stops_sending_is_closed_after_the_gap(server: ServerProcess) -> None:
    """Half a body, then nothing: the 413 and our FIN arrive, and once the lingering gap has passed with nothing
    sent the server's side is gone: the next bytes meet its reset."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(request_head("POST", CHECK, UPLOAD, Content_Type="application/octet-stream", Connection="close")
                     + bytes(UPLOAD // 2))
        answer = b""
        while chunk := sock.recv(65536):  # ends at our FIN, right after the answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 413 ")
        time.sleep(LINGER_GAP_SECONDS + 2)  # (a wait, not a measure: the gap has passed, with a margin)
        with pytest.raises(OSError):  # a reset, then a broken pipe: nobody reads there any more
            for _ in range(100):
                sock.sendall(b"x")
                time.sleep(0.05)
