"""tritonclient[http], unchanged, against a real uvicorn server on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from posenc.service.testing import ServerProcess
from tests.onnx_models import REPOSITORY, SHIPPED, random_inputs, run, session, triton_inputs

MODEL = "rope_attention"
GEOMETRY = {"rope_attention": (8, 8, 64), "llama3_1_attention": (32, 8, 128)}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with ServerProcess({"max_queue_delay_us": 2000, "log_level": "warning"}) as server:
        yield server.address


def _expected(inputs: dict[str, np.ndarray], model: str = MODEL) -> np.ndarray:
    return run(session(REPOSITORY / model / "model.onnx"), inputs)


def test_health_and_metadata(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    meta = client.get_model_metadata("llama3_1_attention")
    assert meta["inputs"][0]["shape"] == [-1, 32, -1, 128] and meta["providers"]
    client.close()


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False, None])
def test_infer_binary_and_json(url: str, binary_in: bool, binary_out: bool | None) -> None:
    client = httpclient.InferenceServerClient(url)
    inputs = random_inputs(8, 8, 64, 2, 6, start=123)
    outputs = None if binary_out is None else [httpclient.InferRequestedOutput("output", binary_data=binary_out)]
    result = client.infer(MODEL, triton_inputs(inputs, binary_in), outputs=outputs, request_id="abc-42")
    response = result.get_response()
    assert response["id"] == "abc-42" and response["model_name"] == MODEL
    got = result.as_numpy("output")
    assert got.dtype == np.float32 and got.shape == (2, 8, 6, 64)
    np.testing.assert_allclose(got, _expected(inputs), atol=1e-5, rtol=1e-5)
    client.close()


def test_llama31_gqa_model(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    inputs = random_inputs(32, 8, 128, 1, 5, start=100000)
    got = client.infer("llama3_1_attention", triton_inputs(inputs, True)).as_numpy("output")
    np.testing.assert_allclose(got, _expected(inputs, "llama3_1_attention"), atol=1e-5, rtol=1e-5)
    client.close()


def test_unknown_model_is_404(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("no_such_model", triton_inputs(random_inputs(8, 8, 64, 1, 2), True))
    assert info.value.status() == "404" and "unknown model 'no_such_model'" in info.value.message()
    client.close()


def test_bad_shape_is_400(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    inputs = random_inputs(8, 8, 64, 1, 2)
    inputs["query"] = np.zeros((1, 8, 2, 32), np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, triton_inputs(inputs, True))
    assert info.value.status() == "400" and "(dim 3 must be 64)" in info.value.message()
    client.close()


def test_concurrent_clients_with_mixed_shapes_get_their_own_results(url: str) -> None:
    jobs = []
    for i in range(24):
        model = MODEL if i % 3 else "llama3_1_attention"
        hq, hkv, dim = GEOMETRY[model]
        jobs.append((model, random_inputs(hq, hkv, dim, 1 + i % 3, 1 + (i * 5) % 9, seed=i, start=i * 11)))
    results: dict[int, np.ndarray | BaseException] = {}

    def worker(indices: list[int]) -> None:
        client = httpclient.InferenceServerClient(url)
        for i in indices:
            model, inputs = jobs[i]
            try:
                results[i] = client.infer(model, triton_inputs(inputs, i % 2 == 0)).as_numpy("output")
            except Exception as exc:
                results[i] = exc
        client.close()

    threads = [threading.Thread(target=worker, args=(list(range(t, len(jobs), 8)),)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == len(jobs)
    client = httpclient.InferenceServerClient(url)
    stats = client.get_inference_statistics(MODEL)["model_stats"][0]
    assert stats["inference_count"] >= 16 and 1 <= stats["execution_count"] <= stats["inference_count"]
    client.close()
    for i, (model, inputs) in enumerate(jobs):
        got = results[i]
        assert isinstance(got, np.ndarray), got
        np.testing.assert_allclose(got, _expected(inputs, model), atol=1e-5, rtol=1e-5)


def test_model_config_and_repository_index_through_tritonclient(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    config = client.get_model_config(MODEL)
    assert config["name"] == MODEL and config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [
        ("query", "TYPE_FP32"), ("key", "TYPE_FP32"), ("value", "TYPE_FP32"), ("position_ids", "TYPE_INT64")]
    index = client.get_model_repository_index()
    assert [(e["name"], e["state"]) for e in index] == [(m, "READY") for m in SHIPPED]
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_model_config("nope")
