"""A request's work ends with its caller and with the process (`posenc.service.request_kit.work`,
`posenc.service.serving.server`): a table whose client left stops at its next row block; after SIGTERM, work that
no check reaches (a table computed in one piece) no longer holds the process: once the graceful timeout has cut
its connection the process exits 1 with a WARNING naming it, where it used to wait for the work to end (68 s for
an audit, minutes for two). Shown by CPU seconds from /proc and by what the log names, never by wall time."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from posenc.service.testing import ServerProcess, http_request, request_head

# [131072, 256] float32 sinusoidal tables (128 MiB): a second or two of CPU each; distinct sizes, never cached
TABLE = "/v1/sinusoidal?max_position={rows}&dim=256&format=raw"


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll `condition()` until true (`what`: for the reader; the test's timeout bounds the wait)."""
    while not condition():
        time.sleep(0.05)


def records(server: ServerProcess) -> list[str]:
    """The access log's records of the sinusoidal tables (written when a request's handler has ended)."""
    return [line for line in server.log().splitlines() if "posenc.access: GET /v1/sinusoidal " in line]


def send_and_leave_once_computing(server: ServerProcess, path: str, cpu_before: float) -> socket.socket:
    """Send `path` on a connection of its own, once the server spends CPU on it (0.1 s)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(request_head("GET", path))
    wait_for(lambda: process_cpu(server.pid) - cpu_before >= 0.1, "the computation to start")
    return sock


@pytest.mark.timeout(180)
def test_a_table_whose_client_left_stops_at_its_next_block() -> None:
    settings = {"log_level": "info", "access_log": True, "table_block_bytes": 64 * 1024}  # (the access log is INFO)
    with ServerProcess(settings) as server:
        before = process_cpu(server.pid)
        status, _, body = http_request(server.port, TABLE.format(rows=131072), timeout=120)
        whole = process_cpu(server.pid) - before  # computed, encoded and sent
        assert status == 200 and len(body) == 131072 * 256 * 4
        before = process_cpu(server.pid)
        send_and_leave_once_computing(server, TABLE.format(rows=131073), before).close()
        wait_for(lambda: len(records(server)) == 2, "the second request's record")  # its handler has ended
        left = process_cpu(server.pid) - before
    assert " 499 " in records(server)[1], records(server)
    assert left < whole / 2, f"{left:.2f} s of CPU after the client left, {whole:.2f} s for the whole table"


@pytest.mark.timeout(180)
def test_sigterm_exits_1_naming_work_that_still_runs() -> None:
    """A table computed in one piece (no block to stop at) outlives the graceful timeout: the process exits 1 without
    waiting for it (3 s of CPU and more), and says what was still running."""
    settings = {"log_level": "warning", "table_block_bytes": 0, "graceful_shutdown_timeout": 0.1}
    with ServerProcess(settings) as server, \
            send_and_leave_once_computing(server, TABLE.format(rows=262144), process_cpu(server.pid)):
        server.send_signal(signal.SIGTERM)
        status = server.wait(60)
    log = server.log()
    assert status == 1, log[-2000:]
    # named by the exit (at the drain's end, or by its deadline when a busy machine kept the event loop from it)
    assert "exiting with status 1: " in log and "tables: GET /v1/sinusoidal (" in log, log[-2000:]
