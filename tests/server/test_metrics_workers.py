"""`/metrics` of a real `posenc serve --workers 2`: totals over both workers, whichever answers the scrape.

Each request goes on a new connection, so the kernel hands the connections to both workers; the per-worker
files in the shared metrics directory (PROMETHEUS_MULTIPROC_DIR, given here so the test can read them)
prove that both served some of them.
"""

from __future__ import annotations

import http.client
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.mmap_dict import MmapedDict

from posenc.service.testing import ServerProcess

ROUTE = "/v1/alibi/slopes"
TABLE = f"{ROUTE}?num_heads=8&format=raw"
CONCURRENCY = 8


def get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def sample(exposition: str, name: str, **labels: str) -> float:
    """The value of one sample (all its labels given) in a Prometheus text exposition; 0 when absent."""
    for line in exposition.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or "")) == labels:
            return float(match.group(2))
    return 0.0


def requests_per_worker(shared: Path) -> list[float]:
    """`posenc_http_requests_total` for the table route, read from each worker's counter file."""
    counts: list[float] = []
    for path in sorted(shared.glob("counter_*.db")):
        mmap = MmapedDict(str(path), read_mode=True)
        try:
            counts.append(sum(value for key, value, _ in mmap.read_all_values()
                              if '"posenc_http_requests_total"' in key and ROUTE in key))
        finally:
            mmap.close()
    return counts


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    shared = tmp_path_factory.mktemp("metrics")
    (shared / "counter_1.db").write_bytes(b"stale")  # left by an earlier run: must be removed at start
    server = ServerProcess({"log_level": "warning", "access_log": False}, args=["--workers", "2"],
                           env={"PROMETHEUS_MULTIPROC_DIR": str(shared)}, ready=None)
    with server:
        deadline = time.monotonic() + 90
        while len(list(shared.glob("gauge_max_*.db"))) < 2:  # both workers built their app
            assert server.poll() is None, f"posenc serve exited with {server.poll()}"
            assert time.monotonic() < deadline, "two workers did not start within 90 s"
            time.sleep(0.2)
        server.wait_ready("/readyz", timeout=max(1.0, deadline - time.monotonic()))
        yield server.port, shared
        assert server.stop(timeout=30) == 0


@pytest.mark.timeout(180)
def test_counters_are_exact_totals_over_both_workers(two_workers: tuple[int, Path]) -> None:
    port, shared = two_workers
    assert not (shared / "counter_1.db").exists()
    sent = 0
    # until both workers answered some: almost always within the first batch, but under a busy CPU one worker has
    # been seen to accept 400 in a row (the other not scheduled while it waits in accept)
    while sent < 4000:
        # eight at a time: one after the other, an idle machine may let the same worker accept every one
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            assert [status for status, _ in pool.map(lambda _: get(port, TABLE), range(40))] == [200] * 40
        sent += 40
        if len(per_worker := requests_per_worker(shared)) == 2 and min(per_worker) > 0:
            break
    assert len(per_worker) == 2 and min(per_worker) > 0, f"one worker answered everything: {per_worker}"
    for _ in range(6):  # scrapes land on either worker: each must report the total
        status, body = get(port, "/metrics")
        assert status == 200
        text = body.decode()
        assert sample(text, "posenc_http_requests_total", method="GET", route=ROUTE, status="200") == sent
        assert sample(text, "posenc_http_request_duration_seconds_count", method="GET", route=ROUTE) == sent
        hits = sample(text, "posenc_table_cache_hits_total")
        misses = sample(text, "posenc_table_cache_misses_total")
        # each worker computed the table: once, or once per request that found its cache still empty
        assert 2 <= misses <= 2 * CONCURRENCY and hits + misses == sent
        assert sample(text, "posenc_build_info", version=__import__("service").__version__) == 1
        # the scrape itself, summed over workers (a request just answered may leave the gauge a moment later)
        deadline = time.monotonic() + 5
        while sample(text, "posenc_http_requests_in_flight") != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
            text = get(port, "/metrics")[1].decode()
        assert sample(text, "posenc_http_requests_in_flight") == 1
