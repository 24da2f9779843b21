"""GET /metrics: Prometheus text, per-route request metrics, cache collector, inference hooks, access log."""

import json
import logging
import logging.config
import os
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from posenc.service.http.app import create_app
from posenc.service.http.logs import JsonFormatter, log_config
from posenc.service.metrics import MULTIPROCESS_ENV, shared_metrics_dir
from posenc.service.settings import Settings
from tests.conftest import running_client
from tests.onnx_models import random_inputs

TABLE = "/v1/sinusoidal?max_position=4&dim=8"


def samples(client: TestClient) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of one scrape."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def test_requests_are_counted_per_route_template_and_status(client: TestClient) -> None:
    client.get(TABLE)
    client.get(TABLE)
    client.get("/v1/sinusoidal?max_position=0&dim=8")
    client.get("/no/such/path/123")
    got = samples(client)
    ok = frozenset({"route": "/v1/sinusoidal", "method": "GET", "status": "200"}.items())
    bad = frozenset({"route": "/v1/sinusoidal", "method": "GET", "status": "422"}.items())
    unmatched = frozenset({"route": "unmatched", "method": "GET", "status": "404"}.items())
    assert got[("posenc_http_requests_total", ok)] == 2
    assert got[("posenc_http_requests_total", bad)] == 1
    assert got[("posenc_http_requests_total", unmatched)] == 1
    assert not any("/no/such" in str(labels) for _, labels in got)
    latency = frozenset({"route": "/v1/sinusoidal", "method": "GET"}.items())
    assert got[("posenc_http_request_duration_seconds_count", latency)] == 3
    assert got[("posenc_http_response_bytes_total", frozenset({"route": "/v1/sinusoidal"}.items()))] > 0


def test_path_parameters_are_templated() -> None:
    app = create_app(Settings())

    @app.get("/items/{item_id}")
    def item(item_id: int) -> dict[str, int]:
        return {"id": item_id}

    client = TestClient(app)
    client.get("/items/1")
    client.get("/items/2")
    got = samples(client)
    labels = frozenset({"route": "/items/{item_id}", "method": "GET", "status": "200"}.items())
    assert got[("posenc_http_requests_total", labels)] == 2


def test_table_cache_hits_misses_and_bytes(client: TestClient) -> None:
    assert client.get(TABLE).headers["x-cache"] == "miss"
    assert client.get(TABLE).headers["x-cache"] == "hit"
    got = samples(client)
    assert got[("posenc_table_cache_hits_total", frozenset())] == 1
    assert got[("posenc_table_cache_misses_total", frozenset())] == 1
    assert got[("posenc_table_cache_bytes", frozenset())] == client.app.state.process.table_cache.size_bytes > 0
    assert got[("posenc_table_cache_entries", frozenset())] == 1


def test_inference_hooks(client: TestClient) -> None:
    metrics = client.app.state.process.metrics
    metrics.observe_batch("m", 3)
    metrics.set_queue_depth("m", 5)
    metrics.observe_run("m", 0.002)
    got = samples(client)
    model = frozenset({"model": "m"}.items())
    assert got[("posenc_batch_size_sum", model)] == 3
    assert got[("posenc_queue_depth", model)] == 5
    assert got[("posenc_onnxruntime_run_seconds_count", model)] == 1


def test_infer_calls_feed_the_batch_queue_and_run_metrics() -> None:
    arrays = random_inputs(8, 8, 64, batch=2, seq=5)
    body = {"inputs": [{"name": name, "shape": list(a.shape), "datatype": "INT64" if a.dtype == np.int64 else "FP32",
                        "data": a.reshape(-1).tolist()} for name, a in arrays.items()]}
    with running_client() as client:
        for _ in range(3):
            assert client.post("/v2/models/rope_attention/infer", json=body).status_code == 200
        got = samples(client)
    model = frozenset({"model": "rope_attention"}.items())
    assert got[("posenc_onnxruntime_run_seconds_count", model)] == 3
    assert got[("posenc_onnxruntime_run_seconds_sum", model)] > 0
    assert got[("posenc_batch_size_count", model)] == 3 and got[("posenc_batch_size_sum", model)] == 3
    assert got[("posenc_queue_depth", model)] == 0  # every request has left the queue


def test_every_app_has_its_own_registry() -> None:
    first, second = TestClient(create_app(Settings())), TestClient(create_app(Settings()))
    first.get(TABLE)
    labels = frozenset({"route": "/v1/sinusoidal", "method": "GET", "status": "200"}.items())
    assert samples(first)[("posenc_http_requests_total", labels)] == 1
    assert ("posenc_http_requests_total", labels) not in samples(second)
    assert REGISTRY.get_sample_value("posenc_http_requests_total") is None


def test_access_log_record_fields(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="posenc.access"):
        client.get(TABLE, headers={"X-Request-ID": "abc-123"})
    (record,) = [r for r in caplog.records if r.name == "posenc.access"]
    doc = json.loads(JsonFormatter().format(record))
    assert doc["method"] == "GET" and doc["path"] == "/v1/sinusoidal" and doc["route"] == "/v1/sinusoidal"
    assert doc["status"] == 200 and doc["bytes"] > 0 and doc["duration_ms"] >= 0
    assert doc["request_id"] == "abc-123" and doc["level"] == "info" and doc["logger"] == "posenc.access"


def test_access_log_can_be_switched_off(caplog: pytest.LogCaptureFixture) -> None:
    client = TestClient(create_app(Settings(access_log=False)))
    with caplog.at_level(logging.INFO, logger="posenc.access"):
        client.get(TABLE)
    assert not [r for r in caplog.records if r.name == "posenc.access"]


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_log_config_is_valid(fmt: str) -> None:
    config = log_config(Settings(log_format=fmt))  # type: ignore[arg-type]
    root_handlers, root_level = list(logging.getLogger().handlers), logging.getLogger().level
    try:
        logging.config.dictConfig(config)  # raises on a malformed document
        assert isinstance(logging.getLogger("posenc").handlers[0].formatter, JsonFormatter) == (fmt == "json")
    finally:
        # Leave logging as pytest's caplog expects it for the other tests.
        for name in config["loggers"]:
            logger = logging.getLogger(name)
            logger.handlers.clear()
            logger.propagate = True
            logger.setLevel(logging.NOTSET)
        logging.getLogger().handlers[:] = root_handlers
        logging.getLogger().setLevel(root_level)
    formatter = config["formatters"]["default"]
    assert formatter["()"].endswith("JsonFormatter" if fmt == "json" else "TextFormatter")
    assert config["loggers"]["uvicorn.access"]["handlers"] == []


def test_v2_model_names_do_not_become_labels(client: TestClient) -> None:
    for name in ("a", "b", "c"):
        client.get(f"/v2/models/{name}")
    got = samples(client)
    routes = {dict(labels).get("route") for name, labels in got if name == "posenc_http_requests_total"}
    assert "/v2/models/{name}" in routes
    assert not routes & {"/v2/models/a", "/v2/models/b", "/v2/models/c"}


def test_a_full_path_request_is_timed_and_its_client_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A request FastAPI answers (not the fast path) is timed from its first message to its last: the access log's
    duration and the latency histogram's sum lie between the route's own sleep and the call's wall time."""
    app = create_app(Settings())

    @app.get("/slow")
    def slow() -> dict[str, bool]:
        time.sleep(0.05)
        return {"ok": True}

    client = TestClient(app)
    with caplog.at_level(logging.INFO, logger="posenc.access"):
        start = time.perf_counter()
        assert client.get("/slow").status_code == 200
        wall = time.perf_counter() - start
    (record,) = [r for r in caplog.records if r.name == "posenc.access"]
    assert 50 <= record.access["duration_ms"] <= 1000 * wall
    assert record.access["client"] == "testclient"  # TestClient's peer address
    got = samples(client)
    assert 0.05 <= got[("posenc_http_request_duration_seconds_sum",
                        frozenset({"route": "/slow", "method": "GET"}.items()))] <= wall


def test_an_unexpected_error_is_counted_as_a_500_with_no_bytes() -> None:
    """The route raised before answering: the outermost error middleware writes the 500, after the metrics layer,
    which records the status and no bytes of its own."""
    app = create_app(Settings())

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("boom")

    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/boom").status_code == 500
        got = samples(client)
    status = frozenset({"route": "/boom", "method": "GET", "status": "500"}.items())
    assert got[("posenc_http_requests_total", status)] == 1
    assert got.get(("posenc_http_response_bytes_total", frozenset({"route": "/boom"}.items())), 0) == 0


def test_shared_metrics_dir_given_is_created_and_emptied_of_stale_counts(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    given = tmp_path / "metrics" / "workers"  # its parent does not exist yet
    monkeypatch.setenv(MULTIPROCESS_ENV, str(given))
    with shared_metrics_dir() as path:
        assert path == str(given) and given.is_dir()
    given.joinpath("counter_1.db").write_bytes(b"stale")
    given.joinpath("notes.txt").write_text("kept")
    with shared_metrics_dir() as path:
        assert sorted(p.name for p in given.iterdir()) == ["notes.txt"]  # an earlier run's counts would be added
    assert given.is_dir() and os.environ[MULTIPROCESS_ENV] == str(given)  # the caller's own: kept


def test_shared_metrics_dir_of_its_own_is_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROCESS_ENV, raising=False)
    with shared_metrics_dir() as path:
        assert os.environ[MULTIPROCESS_ENV] == path and Path(path).is_dir()
    assert MULTIPROCESS_ENV not in os.environ and not Path(path).exists()
