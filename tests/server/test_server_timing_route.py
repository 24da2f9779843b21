"""Server-Timing's `route` phase on posenc's own server: it starts when the request's head is parsed, so a request
that waits behind another on its connection (pipelined) shows that wait, where the app would see none."""

from __future__ import annotations

import asyncio
import time

from posenc.service.request_kit import phases
from posenc.service.testing import ServerProcess, attention_inputs, kserve_request, read_response, request_bytes

TABLE = "/v1/alibi/bias?num_heads=32&query_length=1024&key_length=1024&format=raw"  # 128 MiB, uncached


async def _pipelined(port: int, first: bytes, second: bytes) -> tuple[float, int, int, int, dict[str, str]]:
    """Send both requests at once on one connection: the milliseconds until the first's answer was read whole, its
    status and body length, then the second's status and headers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        started = time.perf_counter()
        writer.write(first + second)
        status, first_headers, _, _ = await asyncio.wait_for(read_response(reader, keep_body=False), 60)
        first_ms = (time.perf_counter() - started) * 1e3
        second_status, headers, _, _ = await asyncio.wait_for(read_response(reader, keep_body=False), 60)
    finally:
        writer.close()
    return first_ms, status, int(first_headers["content-length"]), second_status, headers


def test_a_pipelined_inference_counts_its_wait_behind_the_request_before_it() -> None:
    request = kserve_request(attention_inputs(8, 8, 64, 1, 4))
    second = request_bytes("POST", "/v2/models/rope_attention/infer", request.body, request.headers)
    settings = {"server_timing": True, "cache_bytes": 0, "log_level": "warning"}
    with ServerProcess(settings) as server:
        first_ms, first_status, first_length, status, headers = asyncio.run(
            _pipelined(server.port, request_bytes("GET", TABLE), second))
    assert (first_status, first_length) == (200, 128 << 20) and status == 200
    spans = phases.parse(headers["server-timing"])
    assert next(iter(spans)) == "route" and first_ms > 50
    # its head was parsed with the first request's; its handler started once the first was answered
    assert spans["route"] >= 0.5 * first_ms
    assert spans["total"] >= sum(ms for name, ms in spans.items() if name != "total") - 0.01
