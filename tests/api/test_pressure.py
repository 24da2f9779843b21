"""Behaviour under hostile or unlucky clients: disconnects, deep JSON, oversized headers, a full queue,
non-finite numbers in JSON answers."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from posenc.service.errors import BadRequest
from posenc.service.inference.codecs.kserve_request import parse_infer_request
from posenc.service.testing import kserve_request
from tests.conftest import running_client
from tests.onnx_models import random_inputs

INFER = "/v2/models/rope_attention/infer"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with running_client(max_queue_size=1) as c:
        yield c


def _json_infer_body(inputs: dict[str, np.ndarray]) -> dict[str, Any]:
    return kserve_request(inputs, binary=False).header


def test_deeply_nested_config_is_400(client: TestClient) -> None:
    body = "[" * 1000 + "]" * 1000
    r = client.post("/v1/rope/from-config", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]


def test_huge_accept_header_is_not_echoed_whole(client: TestClient) -> None:
    r = client.get("/v1/alibi/slopes?num_heads=4", headers={"Accept": "text/" + "x" * 1_000_000})
    assert r.status_code == 406 and len(r.content) < 2000 and "1000005 characters" in r.json()["error"]


@pytest.mark.parametrize("value", [" 10 ", "+10", "1_0", "١٠", "0x10"])
def test_header_length_is_decimal_digits_only(value: str) -> None:
    with pytest.raises(BadRequest, match="Inference-Header-Content-Length"):
        parse_infer_request(b'{"inputs": []}' + b"\0" * 16, value)


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "UINT8"])
def test_json_booleans_are_not_numbers(datatype: str) -> None:
    body = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [2], "data": [True, False]}]})
    with pytest.raises(BadRequest, match="not valid for"):
        parse_infer_request(body.encode(), None)


def test_non_finite_outputs_are_json_that_parsers_accept(client: TestClient) -> None:
    inputs = random_inputs(8, 8, 64, 1, 2)
    body = json.dumps(_json_infer_body(inputs)).replace(str(float(inputs["value"][0, 0, 0, 0])), "1e400", 1)
    r = client.post(INFER, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    assert b"NaN" not in r.content.replace(b'"NaN"', b"")  # only the quoted spelling
    data = r.json()["outputs"][0]["data"]
    assert "Infinity" in data or "-Infinity" in data or "NaN" in data
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: JSON.parse not checked")
    parsed = subprocess.run([node, "-e", "let s='';process.stdin.on('data',d=>s+=d).on('end',()=>{"
                             "const o=JSON.parse(s).outputs[0];console.log(o.data.length)})"],
                            input=r.content, capture_output=True, timeout=30)
    assert parsed.returncode == 0, parsed.stderr
    assert int(parsed.stdout) == 1 * 8 * 2 * 64


# --- raw ASGI calls: a client that goes away, a queue that is full --------------------------------


def _call(app: FastAPI, method: str, path: str, chunks: list[bytes], headers: dict[str, str],
          *, disconnect: bool) -> tuple[int | None, list[str]]:
    """Run one request through the ASGI app; the body arrives in `chunks`, then the client disconnects
    (or waits forever). Returns the status sent and which receive() calls happened."""
    received: list[str] = []
    status: list[int] = []
    messages = [{"type": "http.request", "body": c, "more_body": True} for c in chunks]

    async def receive() -> dict[str, Any]:
        if messages:
            received.append("body")
            return messages.pop(0)
        if disconnect:
            received.append("disconnect")
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        return {}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(int(message["status"]))

    path, _, query = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query.encode(),
             "client": ("t", 1),
             "server": ("t", 80), "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}

    async def main() -> None:
        await asyncio.wait_for(app(scope, receive, send), timeout=10)

    asyncio.run(main())
    return (status[0] if status else None), received


@pytest.mark.parametrize("path", ["/v1/t5/bias?query_length=2&key_length=2", INFER])
def test_client_disconnect_is_499_not_500(client: TestClient, path: str, caplog: pytest.LogCaptureFixture) -> None:
    app: FastAPI = client.app  # type: ignore[assignment]
    with caplog.at_level(logging.INFO):
        status, _ = _call(app, "POST", path, [b"\x93NUMPY" + b"\0" * 100], {"content-length": "100000"},
                          disconnect=True)
    assert status == 499
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert [r for r in caplog.records if "client closed the connection" in r.getMessage()]
    metrics = client.get("/metrics").text
    route = path.split("?")[0].replace("rope_attention", "{name}")
    assert f'posenc_http_requests_total{{method="POST",route="{route}",status="499"}}' in metrics


def test_full_queue_refuses_before_reading_the_body(client: TestClient) -> None:
    app: FastAPI = client.app  # type: ignore[assignment]
    engine = app.state.process.engine
    model = engine.models["rope_attention"]
    with engine.admission(model):  # the one place (max_queue_size=1) is taken
        status, received = _call(app, "POST", INFER, [], {"content-length": "1000000"}, disconnect=False)
    assert status == 503 and received == []
