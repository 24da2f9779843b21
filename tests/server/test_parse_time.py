"""A body's parse costs time in proportion to its size, whatever the body is made of: the probe's KServe JSON
body of `"data":[` repeated and never closed took 21 s of server CPU at 1 MiB and more than a minute at 2 MiB.
Measured by the server's own CPU counter (user + system time of its process, as the kernel counts it for
`getrusage` inside it), not by wall time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from posenc.service.testing import ServerProcess, http_request

PATHOLOGICAL = b'"data":['
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def server_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process `pid` has used (all its threads), from the kernel's counters."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14 and 15 of stat)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess({"log_level": "warning"}) as process:
        yield process


def _cpu_of_one(server: ServerProcess, body: bytes) -> tuple[float, int]:
    before = server_cpu_seconds(server.pid)
    status, _, _ = http_request(server.port, "/v2/models/rope_attention/infer", "POST", body, timeout=30)
    return server_cpu_seconds(server.pid) - before, status


def test_the_pathological_body_costs_linear_server_cpu(server: ServerProcess) -> None:
    _cpu_of_one(server, PATHOLOGICAL * 1024)  # warm: the first request's imports are no part of a parse
    cpu = {}
    for mib in (1, 2, 4):
        seconds, status = _cpu_of_one(server, PATHOLOGICAL * (mib << 20 >> 3))
        assert status == 400
        cpu[mib] = seconds
    # at most linear growth, with a floor for the counter's resolution (10 ms) and the request's fixed cost
    floor = 0.05
    assert cpu[2] <= 2.5 * max(cpu[1], floor) and cpu[4] <= 2.5 * max(cpu[2], floor), cpu
    assert cpu[4] < 1.0, cpu  # 4 MiB read and parsed (on a 2-core machine shared with others: generous)
