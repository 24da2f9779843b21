"""SIGTERM during a burst of table and batched inference requests: every request sent before the signal is
answered (including inference requests still waiting in the batcher's queue), new connections are refused,
and the process exits 0 within the graceful timeout.

Connections refused after the signal are expected: a client behind a load balancer (deploy/nginx) gets them
retried on another replica; tests/server/test_replicas.py and scripts/replicas-test.sh cover that part.
"""

from __future__ import annotations

import http.client
import signal
import socket
import threading
import time
from dataclasses import dataclass

import pytest

from posenc.service.testing import kserve_request, request_head
from tests.onnx_models import random_inputs
from tests.server.test_shutdown import running_server

QUEUE_DELAY_S = 0.4  # the first request of a batch waits this long for others: the burst sits in the queue
INFER_CLIENTS, TABLE_CLIENTS = 12, 12


@dataclass
class Outcome:
    kind: str
    sent_at: float | None = None  # when the whole request was written; None: never (refused, reset)
    answered_at: float | None = None
    status: int | None = None
    error: str | None = None


def infer_request() -> bytes:
    request = kserve_request(random_inputs(8, 8, 64, batch=1, seq=16, seed=3), content_type=True)
    return request_head("POST", "/v2/models/rope_attention/infer", len(request.body), **request.headers) + request.body


def table_request(i: int) -> bytes:
    return request_head("GET", f"/v1/sinusoidal?max_position={4096 + i}&dim=256&format=raw")  # distinct: no cache hits


def client(port: int, payload: bytes, outcome: Outcome, start: threading.Barrier) -> None:
    start.wait()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(payload)
            outcome.sent_at = time.monotonic()
            response = http.client.HTTPResponse(sock)
            response.begin()
            response.read()
            outcome.status, outcome.answered_at = response.status, time.monotonic()
    except OSError as exc:
        outcome.error = type(exc).__name__


def refused_within(port: int, seconds: float) -> bool:
    """Whether a new connection is refused within `seconds` (the listener closes after the settle passes)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(120)
def test_sigterm_during_a_burst_answers_every_accepted_request_and_exits_0() -> None:
    payloads = [("infer", infer_request())] * INFER_CLIENTS + \
        [("table", table_request(i)) for i in range(TABLE_CLIENTS)]
    outcomes = [Outcome(kind) for kind, _ in payloads]
    with running_server(max_queue_delay_us=int(QUEUE_DELAY_S * 1e6), graceful_shutdown_timeout=20,
                        access_log="false") as (proc, port):
        start = threading.Barrier(len(payloads) + 1)
        threads = [threading.Thread(target=client, args=(port, payload, outcome, start))
                   for (_, payload), outcome in zip(payloads, outcomes, strict=True)]
        for thread in threads:
            thread.start()
        start.wait()
        deadline = time.monotonic() + 10
        while sum(o.sent_at is not None for o in outcomes) < len(outcomes) and time.monotonic() < deadline:
            time.sleep(0.01)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert refused_within(port, 5.0), "new connections still accepted 5 s after SIGTERM"
        for thread in threads:
            thread.join(60)
        status = proc.wait(30)
        exited = time.monotonic() - signalled
    sent_before = [o for o in outcomes if o.sent_at is not None and o.sent_at < signalled]
    assert len(sent_before) == len(outcomes), "the burst was not fully sent before the signal"
    failed = [o for o in sent_before if o.status != 200]
    assert not failed, f"requests sent before SIGTERM not answered 200: {failed}"
    drained = [o for o in sent_before if o.kind == "infer" and o.answered_at and o.answered_at > signalled]
    assert drained, "no inference request was still queued at the signal: the test did not test the drain"
    assert status == 0
    assert exited < 20
