"""Server-Timing: where one inference's time went on the server (`posenc.service.request_kit.phases`), in the
answer's header when POSENC_SERVER_TIMING is on, with the run the batcher measured for each request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from fastapi.testclient import TestClient
from starlette.types import ASGIApp, Receive, Scope, Send

from posenc.service.http.app import create_app
from posenc.service.inference.runtime.batcher import Batcher
from posenc.service.request_kit import phases
from posenc.service.settings import Settings
from posenc.service.testing import kserve_request
from tests.conftest import running_client
from tests.onnx_models import random_inputs

MODEL = "rope_attention"
HTTP_PHASES = ["route", "admit", "read", "parse", "queue", "run", "encode", "total"]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_lap_leaves_out_what_was_added_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(phases.time, "perf_counter", clock)
    timed = phases.Phases()
    clock.now += 0.010
    timed.lap("parse")
    clock.now += 0.050
    timed.add("run", 0.030)  # measured inside the next lap
    timed.lap("queue")
    clock.now += 0.005
    timed.lap("encode")
    timed.lap("encode")  # a second lap of one name adds to it (nothing passed here)
    assert timed.spans == pytest.approx({"parse": 0.010, "run": 0.030, "queue": 0.020, "encode": 0.005})
    assert phases.parse(timed.value()) == pytest.approx(
        {"parse": 10.0, "queue": 20.0, "run": 30.0, "encode": 5.0, "total": 65.0})
    assert timed.value().startswith("parse;dur=10.000, queue;dur=20.000, run;dur=30.000, encode;dur=5.000")


def test_laps_count_from_since(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(phases.time, "perf_counter", clock)
    timed = phases.Phases(since=clock.now - 0.004)  # the request's head was parsed 4 ms ago
    timed.lap("route")
    clock.now += 0.001
    timed.lap("parse")
    assert phases.parse(timed.value()) == pytest.approx({"route": 4.0, "parse": 1.0, "total": 5.0})


def test_parse_reads_the_w3c_syntax_with_other_parameters() -> None:
    assert phases.parse('db;desc="x";dur=1.5, cache;dur=0, miss') == {"db": 1.5, "cache": 0.0}


def test_nothing_is_recorded_outside_an_inference() -> None:
    async def request() -> phases.Phases | None:
        phases.lap("parse")
        phases.add_run(1.0)  # no current request: nothing to add to
        return phases.current()

    assert asyncio.run(request()) is None


def _post(client: TestClient, inputs: dict[str, np.ndarray]) -> tuple[int, dict[str, str]]:
    request = kserve_request(inputs)
    answer = client.post(f"/v2/models/{MODEL}/infer", content=request.body, headers=request.headers)
    return answer.status_code, dict(answer.headers)


@pytest.fixture(scope="module")
def timed_client() -> Iterator[TestClient]:
    with running_client(server_timing=True, max_queue_delay_us=0) as client:
        yield client


def test_an_inference_answers_its_phases_when_on(timed_client: TestClient) -> None:
    status, headers = _post(timed_client, random_inputs(8, 8, 64, 2, 64))
    assert status == 200
    spans = phases.parse(headers["server-timing"])
    assert list(spans) == HTTP_PHASES
    assert all(ms >= 0 for ms in spans.values())
    assert spans["run"] > 0 and spans["total"] >= sum(ms for name, ms in spans.items() if name != "total") - 0.01


class Delay:
    """Middleware that holds every request `seconds` before passing it on (inside the app, before routing)."""

    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(self.seconds)
        await self.app(scope, receive, send)


def test_route_is_the_time_before_the_handler() -> None:
    app = create_app(Settings(server_timing=True, max_queue_delay_us=0))
    app.add_middleware(Delay, seconds=0.03)
    with TestClient(app) as client:  # type: ignore[arg-type]
        status, headers = _post(client, random_inputs(8, 8, 64, 1, 4))
    spans = phases.parse(headers["server-timing"])
    assert status == 200 and 30 <= spans["route"] < 1000
    assert spans["total"] >= spans["route"] + spans["run"]


def test_errors_and_other_routes_carry_no_timing(timed_client: TestClient) -> None:
    inputs = random_inputs(8, 8, 64, 1, 4)
    del inputs["value"]
    status, headers = _post(timed_client, inputs)
    assert status == 400 and "server-timing" not in headers
    assert "server-timing" not in timed_client.get(f"/v2/models/{MODEL}").headers


def test_no_header_by_default() -> None:
    with running_client(max_queue_delay_us=0) as client:
        status, headers = _post(client, random_inputs(8, 8, 64, 1, 4))
    assert status == 200 and "server-timing" not in headers


class SlowModel:
    """output = x + 1, each run `seconds` long."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.seconds)
        return {"output": inputs["x"] + 1}


@pytest.mark.parametrize("batching", [True, False])
def test_each_request_gets_the_run_that_answered_it(batching: bool) -> None:
    """Alone, batched with others (the batch's run), or split into runs of max_batch_size rows (their sum)."""

    async def one(rows: int) -> float:
        timed = phases.started()
        await batcher.submit({"x": np.zeros((rows, 3, 2), np.float32)})
        return timed.spans["run"]

    async def main() -> list[float]:
        runs = await asyncio.gather(one(1), one(1), one(1), one(5))
        await batcher.close()
        return runs

    batcher = Batcher(SlowModel(0.02), ThreadPoolExecutor(2), max_batch_size=4, max_queue_delay_us=10_000,
                      max_queue_size=16, batching=batching)
    runs = asyncio.run(main())
    assert all(0.02 <= seconds < 0.5 for seconds in runs[:3])
    assert runs[3] >= 0.04  # 5 rows: two runs of at most 4
