"""A check's memory: what `POST /v1/check/...` reserves in the memory budget covers what the check holds at its peak
(the body and its decoded tensors, then the decoded tensors, the reference, the tolerances and the comparison's
float64 work), and it is reserved once, before the body is read, until the report is built: never an upload held
outside the budget while it waits for its work's share.

scripts/crowd.py's 'new-connections' crowd sends 8 MiB uploads of zeros against an ALiBi bias: their work was
counted as 6 float64 arrays of the table's size and measured 12.7 (a list of every failing index among them), so
concurrent checks held twice what they reserved and the server's peak passed its documented bound."""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save as safetensors_save

import posenc.service.check.routes
from posenc.service.check.request import CheckRequest
from posenc.service.check.table_check import run
from posenc.service.settings import Settings
from posenc.service.tables import TABLES
from posenc.service.tables.registry import TableQuery
from tests.conftest import running_client

ALIBI = "num_heads=8&query_length=256&key_length=512"  # the crowd's [8, 512, 512] at half the rows: 1 Mi elements
CASES = [  # table, query, upload: about 1 Mi elements each, so the arrays dwarf everything else traced
    ("/v1/alibi/bias", ALIBI, "zeros"),
    ("/v1/alibi/bias", ALIBI, "golden"),
    ("/v1/alibi/bias", ALIBI + "&dtype=float16", "zeros"),
    ("/v1/rope", "max_position=4096&head_dim=128", "zeros"),
    ("/v1/rope", "max_position=4096&head_dim=128", "golden"),
    ("/v1/sinusoidal", "max_position=4096&dim=256", "zeros"),
    ("/v1/t5/buckets", "query_length=1024&key_length=1024", "zeros"),
    ("/v1/deberta/buckets", "query_length=1024&key_length=1024", "zeros"),  # int64: 8 bytes an element uploaded
]


def _query(path: str, query: str) -> TableQuery:
    return TABLES[path].query(**dict(parse_qsl(query)))


def _upload(query: TableQuery, upload: str) -> bytes:
    """The golden tables or zeros shaped like them: one tensor as .npy, several as safetensors."""
    tensors = {name: value for name, value in query.compute().tensors.items() if name in query.specs()}
    if upload == "zeros":
        tensors = {name: np.zeros_like(value) for name, value in tensors.items()}
    if len(tensors) > 1:
        return safetensors_save(tensors)
    buffer = io.BytesIO()
    np.save(buffer, next(iter(tensors.values())))
    return buffer.getvalue()


@pytest.mark.parametrize(("path", "query", "upload"), CASES, ids=[f"{u}-{p}-{q}" for p, q, u in CASES])
def test_a_checks_estimate_covers_what_it_holds(path: str, query: str, upload: str) -> None:
    table = _query(path, query)
    check = CheckRequest.build(TABLES[path], table, tensor=None, config=None, settings=Settings())
    bodies = [_upload(table, upload)]
    length = len(bodies[0])
    tracemalloc.start()
    try:
        planned = check.plan(bodies[0], "application/octet-stream")
        _, decoding = tracemalloc.get_traced_memory()  # beside the body, allocated before tracing
        bodies.clear()  # the route drops the body once decoded
        tracemalloc.reset_peak()
        report = run(planned)
        _, working = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert report.verdict == ("matches" if upload == "golden" else "mismatch")
    peak = max(length + decoding, working)
    float64_size = 8 * sum(spec.size for spec in table.specs().values())
    assert peak <= planned.working_bytes, (f"held {peak / float64_size:.2f} float64 tables' worth, reserved "
                                           f"{planned.working_bytes / float64_size:.2f}")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with running_client() as running:
        yield running


def test_the_route_reserves_the_whole_check_before_reading_its_body(client: TestClient,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    budget = client.app.state.process.memory_budget  # type: ignore[attr-defined]
    routes = posenc.service.check.routes
    seen: dict[str, int] = {}
    read_body, real_run = routes.read_body, routes.run

    async def reading(*args: Any, **kwargs: Any) -> bytes:
        seen["reading"] = budget.reserved
        return await read_body(*args, **kwargs)

    def running(planned: Any) -> Any:
        seen["running"], seen["held"] = budget.reserved, planned.working_bytes
        return real_run(planned)

    monkeypatch.setattr(routes, "read_body", reading)
    monkeypatch.setattr(routes, "run", running)
    body = _upload(_query("/v1/alibi/bias", ALIBI), "zeros")
    r = client.post(f"/v1/check/alibi/bias?{ALIBI}&alibi_bias_max=4", content=body,
                    headers={"Content-Type": "application/octet-stream"})
    assert r.status_code == 200 and r.json()["verdict"] == "mismatch", r.text
    assert seen["held"] > 2 * len(body)  # the work, not only the upload
    assert seen["reading"] >= seen["held"] and seen["running"] >= seen["held"], seen
    assert budget.reserved == 0
