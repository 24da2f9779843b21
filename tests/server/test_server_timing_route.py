"""Server-Timing's `route` phase on posenc's own server: it starts when the request's head is parsed, so a request
that waits behind another on its connection (pipelined) shows that wait, where the app would see none."""

from __future__ import annotations

import socket
import time

from posenc.service.inference import phases
from posenc.service.testing import ServerProcess, attention_inputs, kserve_request, request_bytes

TABLE = "/v1/alibi/bias?num_heads=32&query_length=1024&key_length=1024&format=raw"  # 128 MiB, uncached


def _read_answer(sock: socket.socket) -> tuple[int, dict[str, str], int]:
    """Status, headers and body length of the next response on `sock`, read to its Content-Length."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        assert byte, "the server closed the connection"
        head += byte
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines if line)}
    left = int(headers["content-length"])
    while left:
        left -= len(sock.recv(min(left, 1 << 20)))
    return int(status_line.split()[1]), headers, int(headers["content-length"])


def test_a_pipelined_inference_counts_its_wait_behind_the_request_before_it() -> None:
    request = kserve_request(attention_inputs(8, 8, 64, 1, 4))
    second = request_bytes("POST", "/v2/models/rope_attention/infer", request.body, request.headers)
    settings = {"server_timing": True, "cache_bytes": 0, "log_level": "warning"}
    with ServerProcess(settings) as server, socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        started = time.perf_counter()
        sock.sendall(request_bytes("GET", TABLE) + second)
        assert _read_answer(sock)[::2] == (200, 128 << 20)
        first_ms = (time.perf_counter() - started) * 1e3
        status, headers, _ = _read_answer(sock)
    assert status == 200
    spans = phases.parse(headers["server-timing"])
    assert next(iter(spans)) == "route" and first_ms > 50
    # its head was parsed with the first request's; its handler started once the first was answered
    assert spans["route"] >= 0.5 * first_ms
    assert spans["total"] >= sum(ms for name, ms in spans.items() if name != "total") - 0.01
