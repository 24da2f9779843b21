"""KServe v2 REST through TestClient: JSON and binary tensors, metadata, and every 400/404/413."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from posenc.service.testing import kserve_request, request_with_header
from tests.conftest import running_client
from tests.onnx_models import REPOSITORY, SHIPPED, geometry, random_inputs, run, session

MODEL = "rope_attention"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with running_client(max_queue_delay_us=0) as c:
        yield c


def _json_body(inputs: dict[str, np.ndarray], **extra: object) -> dict:
    return kserve_request(inputs, binary=False, extra=extra).header


def _binary_body(inputs: dict[str, np.ndarray], **extra: object) -> tuple[bytes, dict[str, str]]:
    request = kserve_request(inputs, extra=extra)
    return request.body, request.headers


def _expected(inputs: dict[str, np.ndarray], model: str = MODEL) -> np.ndarray:
    return run(session(REPOSITORY / model / "model.onnx"), inputs)


def test_server_endpoints(client: TestClient) -> None:
    assert client.get("/v2").json()["extensions"] == ["binary_tensor_data"]
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").status_code == 200
    assert client.get(f"/v2/models/{MODEL}/ready").json()["ready"] is True
    assert client.get(f"/v2/models/{MODEL}/versions/1").json()["name"] == MODEL
    stats = client.get(f"/v2/models/{MODEL}/versions/1/stats").json()["model_stats"][0]
    assert stats["name"] == MODEL and stats["execution_count"] <= stats["inference_count"]


@pytest.mark.parametrize("path", ["/v2/models/nope", "/v2/models/nope/ready", f"/v2/models/{MODEL}/versions/2"])
def test_unknown_model_or_version_is_404(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and r.json()["type"] == "not_found"
    assert client.post(path.replace("/ready", "") + "/infer", content=b"{}").status_code == 404


def test_json_infer(client: TestClient) -> None:
    inputs = random_inputs(8, 8, 64, 2, 5, start=40)
    r = client.post(f"/v2/models/{MODEL}/infer", content=json.dumps(_json_body(inputs, id="req-1")))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = r.json()
    assert out["id"] == "req-1" and out["model_name"] == MODEL and out["model_version"] == "1"
    (tensor,) = out["outputs"]
    assert tensor["name"] == "output" and tensor["datatype"] == "FP32" and tensor["shape"] == [2, 8, 5, 64]
    np.testing.assert_allclose(np.array(tensor["data"], np.float32).reshape(2, 8, 5, 64), _expected(inputs),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", SHIPPED)
def test_binary_infer_on_the_versioned_route(client: TestClient, model: str) -> None:
    hq, hkv, dim = geometry(model)
    # far from 0, within the model's positions (< 4096, < 8192, < 32768; the others < 131072)
    start = {"rope_attention": 4000, "gemma_2b_attention": 8000, "qwen2_5_7b_attention": 30000}.get(model, 90000)
    inputs = random_inputs(hq, hkv, dim, 3, 4, start=start)
    body, headers = _binary_body(inputs, parameters={"binary_data_output": True})
    r = client.post(f"/v2/models/{model}/versions/1/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    length = int(r.headers["Inference-Header-Content-Length"])
    head = json.loads(r.content[:length])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 3 * hq * 4 * dim * 4
    got = np.frombuffer(r.content[length:], np.float32).reshape(3, hq, 4, dim)
    np.testing.assert_allclose(got, _expected(inputs, model), atol=1e-5, rtol=1e-5)


def test_binary_in_json_out_with_requested_output(client: TestClient) -> None:
    inputs = random_inputs(8, 8, 64, 1, 2)
    body, headers = _binary_body(inputs, outputs=[{"name": "output", "parameters": {"binary_data": False}}])
    r = client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert r.status_code == 200 and "Inference-Header-Content-Length" not in r.headers
    assert len(r.json()["outputs"][0]["data"]) == 8 * 2 * 64


def _bad(inputs: dict[str, np.ndarray], name: str, array: np.ndarray) -> dict[str, np.ndarray]:
    return {**inputs, name: array}


GOOD = random_inputs(8, 8, 64, 2, 3)
BAD_CASES = [
    ("unknown input", {**GOOD, "mask": np.ones((2, 3), np.int64)}, "unknown input(s) ['mask']"),
    ("missing input", {k: v for k, v in GOOD.items() if k != "value"}, "missing input(s) ['value']"),
    ("datatype", _bad(GOOD, "position_ids", GOOD["position_ids"].astype(np.float32)),
     "input 'position_ids': datatype FP32, the model expects INT64"),
    ("head dim", _bad(GOOD, "query", np.zeros((2, 8, 3, 32), np.float32)),
     "input 'query': shape [2, 8, 3, 32] does not match [-1, 8, -1, 64] (dim 3 must be 64)"),
    ("rank", _bad(GOOD, "query", np.zeros((2, 8, 3), np.float32)), "has rank 3"),
    ("gqa ratio", _bad(_bad(GOOD, "key", np.zeros((2, 3, 3, 64), np.float32)), "value",
                       np.zeros((2, 3, 3, 64), np.float32)), "Hq must be a multiple of Hkv"),
    ("kv heads", _bad(_bad(GOOD, "key", np.zeros((2, 4, 3, 64), np.float32)), "value",
                      np.zeros((2, 4, 3, 64), np.float32)), "(dim 1 must be 8)"),
    ("key != value", _bad(GOOD, "value", np.zeros((2, 8, 4, 64), np.float32)), "must have the same shape"),
    ("batch", _bad(GOOD, "position_ids", np.zeros((1, 3), np.int64)), "disagree on the batch size"),
    ("sequence", _bad(GOOD, "position_ids", np.zeros((2, 4), np.int64)), "disagree on the sequence length"),
    ("position high", _bad(GOOD, "position_ids", np.full((2, 3), 4096, np.int64)),
     "values must be in [0, 4096); found 4096 at index [0, 0]"),
    ("position negative", _bad(GOOD, "position_ids", np.array([[0, 1, 2], [0, -1, 2]], np.int64)),
     "found -1 at index [1, 1]"),
    ("empty sequence", {k: (v[:, :, :0] if v.ndim == 4 else v[:, :0]) for k, v in GOOD.items()}, "must be >= 1"),
]


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(("case", "inputs", "message"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_invalid_inputs_are_400_with_a_precise_message(client: TestClient, case: str, inputs: dict,
                                                       message: str, binary: bool) -> None:
    if binary:
        body, headers = _binary_body(inputs)
    else:
        body, headers = json.dumps(_json_body(inputs)).encode(), {}
    r = client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"] and r.json()["type"] == "bad_request"


def test_malformed_bodies_are_400(client: TestClient) -> None:
    body, headers = _binary_body(GOOD)
    for content, hdrs, message in [
        (body + b"\0" * 4, headers, "trailing bytes"),
        (body[:-8], headers, "binary data is missing"),
        (body, {"Inference-Header-Content-Length": "x"}, "not an integer"),
        (b"\xff\xfe", {}, "not valid JSON"),
        (json.dumps(_json_body(GOOD, outputs=[{"name": "logits"}])).encode(), {}, "unknown output(s) ['logits']"),
    ]:
        r = client.post(f"/v2/models/{MODEL}/infer", content=content, headers=hdrs)
        assert r.status_code == 400 and message in r.json()["error"], (message, r.text)


RANK_65 = [*GOOD["query"].shape, *[1] * 61]  # query's elements, in 65 dimensions: more than numpy's 64


@pytest.mark.parametrize("route", ["infer", "check"])
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_rank_over_64_is_400_naming_the_limit(client: TestClient, route: str, binary: bool) -> None:
    """A shape of 65 dimensions is refused by the parser, before its data becomes an array (numpy cannot hold
    one: it was a 500), on the infer and the check route."""
    header = kserve_request(GOOD, binary=binary).header
    header["inputs"][0]["shape"] = RANK_65
    request = request_with_header(header, list(GOOD.values()) if binary else [])
    r = client.post(f"/v2/models/{MODEL}/{route}", content=request.body, headers=request.headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "input 'query': shape has rank 65; at most 64 dimensions are supported"


def test_request_over_the_byte_limit_is_413() -> None:
    with running_client(max_request_bytes=1000) as small:
        body, headers = _binary_body(GOOD)
        r = small.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert r.status_code == 413 and "POSENC_MAX_REQUEST_BYTES" in r.json()["error"]


def test_small_kserve_requests_take_no_detour_through_the_threadpool(client: TestClient,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Metadata, readiness, statistics, config and small binary infers run on the event loop (the model itself
    on the inference threads): a worker-thread hop per request costs more than these routes' own work."""
    import starlette.concurrency

    hops: list[object] = []
    original = starlette.concurrency.run_in_threadpool

    async def counted(func: object, *args: object, **kwargs: object) -> object:
        hops.append(func)
        return await original(func, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr("fastapi.dependencies.utils.run_in_threadpool", counted)
    monkeypatch.setattr("fastapi.routing.run_in_threadpool", counted)
    for path in ("", "/ready", "/stats", "/config", "/versions/1", "/versions/1/ready"):
        assert client.get(f"/v2/models/{MODEL}{path}").status_code == 200, path
    body, headers = _binary_body(random_inputs(8, 8, 64, 1, 4))
    assert client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers).status_code == 200
    assert hops == []
