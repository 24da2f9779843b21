"""Triton's model-repository views: the model configuration JSON and the repository index."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from posenc.service.inference.runtime import calibration
from posenc.service.inference.runtime.repository import ConfigError, ModelConfig, calibration_caches
from posenc.service.settings import Settings
from tests.conftest import running_client
from tests.onnx_models import REPOSITORY, SHIPPED


def _inputs(hq: int, hkv: int, dim: int) -> list[tuple[str, str, list[int]]]:
    return [("query", "TYPE_FP32", [hq, -1, dim]), ("key", "TYPE_FP32", [hkv, -1, dim]),
            ("value", "TYPE_FP32", [hkv, -1, dim]), ("position_ids", "TYPE_INT64", [-1])]


# Written out, not read from config.json: (Hq, Hkv, D) of each shipped model's public configuration
EXPECTED_INPUTS = {
    "rope_attention": _inputs(8, 8, 64),
    "llama3_1_attention": _inputs(32, 8, 128),
    "qwen2_5_7b_attention": _inputs(28, 4, 128),
    "qwen2_5_7b_yarn_attention": _inputs(28, 4, 128),
    "phi3_5_mini_attention": _inputs(32, 32, 96),
    "gemma_2b_attention": _inputs(8, 1, 256),
}


@pytest.mark.parametrize("model", sorted(EXPECTED_INPUTS))
@pytest.mark.parametrize("suffix", ["", "/versions/1"])
def test_config_is_tritons_model_configuration(model: str, suffix: str) -> None:
    with running_client(max_queue_delay_us=300, max_queue_size=7) as client:
        config = client.get(f"/v2/models/{model}{suffix}/config").json()
    declared = json.loads((REPOSITORY / model / "config.json").read_text())
    assert config["name"] == model and config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == declared["max_batch_size"]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == EXPECTED_INPUTS[model]
    # dims drop the batch dimension of config.json's shapes
    assert [t["dims"] for t in config["output"]] == [o["shape"][1:] for o in declared["outputs"]]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 300
    assert config["dynamic_batching"]["default_queue_policy"] == {"max_queue_size": 7}
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


def test_repository_index_lists_every_shipped_model_ready() -> None:
    with running_client() as client:
        index = client.post("/v2/repository/index").json()
        metadata = {name: client.get(f"/v2/models/{name}").json() for name in SHIPPED}
    assert sorted(EXPECTED_INPUTS) == list(SHIPPED)
    assert index == [{"name": name, "version": "1", "state": "READY"} for name in SHIPPED]
    for name, meta in metadata.items():
        declared = json.loads((REPOSITORY / name / "config.json").read_text())
        assert meta["name"] == name and meta["platform"] == "onnxruntime_onnx"
        assert meta["inputs"] == declared["inputs"] and meta["outputs"] == declared["outputs"]


def test_config_follows_the_settings() -> None:
    with running_client(batching=False, max_batch_size=3) as client:
        config = client.get("/v2/models/rope_attention/config").json()
        missing = client.get("/v2/models/nope/config")
        version = client.get("/v2/models/rope_attention/versions/2/config")
    assert "dynamic_batching" not in config and config["max_batch_size"] == 3
    assert missing.status_code == 404 and version.status_code == 404


@pytest.fixture
def half_broken(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPOSITORY / "rope_attention", repo / "rope_attention")
    shutil.copytree(REPOSITORY / "rope_attention", repo / "broken")
    (repo / "broken" / "config.json").write_text("{not json")
    return repo


def test_repository_index_lists_states_and_reasons(half_broken: Path) -> None:
    with running_client(model_repository=half_broken) as client:
        everything = client.post("/v2/repository/index").json()
        ready_only = client.post("/v2/repository/index", json={"ready": True}).json()
        broken_config = client.get("/v2/models/broken/config")
        bad_body = client.post("/v2/repository/index", json={"ready": "maybe"})
    assert [(e["name"], e["version"], e["state"]) for e in everything] == [
        ("broken", "1", "UNAVAILABLE"), ("rope_attention", "1", "READY")]
    assert "config.json is not valid JSON" in everything[0]["reason"]
    assert ready_only == [{"name": "rope_attention", "version": "1", "state": "READY"}]
    assert broken_config.status_code == 503 and "not valid JSON" in broken_config.json()["error"]
    assert bad_body.status_code == 422


@pytest.mark.parametrize("body", [{"ready": 0}, {"ready": "true"}, {"ready": None}])
def test_repository_index_takes_only_a_json_boolean(body: dict) -> None:
    with running_client() as client:
        r = client.post("/v2/repository/index", json=body)
        not_json = client.post("/v2/repository/index", content=b"\xff", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "ready" in r.json()["error"]
    assert not_json.status_code == 400 and set(not_json.json()) == {"error", "type"}


TENSOR = {"name": "x", "datatype": "FP32", "shape": [-1, -1, 8]}


@pytest.mark.parametrize(("data", "message"), [
    ([TENSOR], "config.json must hold a JSON object"),
    ({"outputs": [TENSOR]}, "'inputs' must be a non-empty list"),
    ({"inputs": [], "outputs": [TENSOR]}, "'inputs' must be a non-empty list"),
    ({"inputs": [TENSOR], "outputs": {"y": TENSOR}}, "'outputs' must be a non-empty list"),
    ({"inputs": [{"name": "x", "datatype": "FP32"}], "outputs": [TENSOR]}, "'inputs' entries need name, datatype"),
    ({"inputs": [{**TENSOR, "shape": [-1, "n"]}], "outputs": [TENSOR]}, "'inputs' entries need name, datatype"),
    ({"inputs": [{**TENSOR, "shape": [4, -1]}], "outputs": [TENSOR]}, "a dynamic batch dim 0 required"),
    ({"inputs": [{**TENSOR, "shape": []}], "outputs": [TENSOR]}, "a dynamic batch dim 0 required"),
    ({"inputs": [{**TENSOR, "datatype": "FP99"}], "outputs": [TENSOR]}, "inputs 'x': known datatype"),
    ({"inputs": [TENSOR], "outputs": [TENSOR], "max_batch_size": 0}, "max_batch_size must be an integer >= 1"),
    ({"inputs": [TENSOR], "outputs": [TENSOR], "max_batch_size": "8"}, "max_batch_size must be an integer >= 1"),
    ({"inputs": [TENSOR], "outputs": [TENSOR], "max_position": 0}, "max_position must be an integer >= 1"),
    ({"inputs": [TENSOR], "outputs": [TENSOR], "max_position": "4096"}, "max_position must be an integer >= 1"),
])
def test_a_config_json_the_service_cannot_rely_on_is_refused_with_the_reason(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        ModelConfig.parse("m", data)


def test_config_json_defaults_and_the_sequence_axis() -> None:
    config = ModelConfig.parse("m", {"inputs": [TENSOR, {**TENSOR, "name": "p", "shape": [-1, 8, -1]},
                                                {**TENSOR, "name": "s", "shape": [-1, 8]}], "outputs": [TENSOR]})
    assert (config.max_batch_size, config.causal, config.max_position, config.sha256) == (1, False, None, None)
    assert [tensor.sequence_axis() for tensor in config.inputs] == [1, 2, None]  # axis 0 is the batch
    causal = ModelConfig.parse("m", {"inputs": [TENSOR], "outputs": [TENSOR], "causal": True, "max_position": 8})
    assert causal.causal and causal.max_position == 8


def test_the_calibration_cache_settings() -> None:
    def paths(**values: str) -> tuple[Path | None, Path | None]:
        rules, cache = calibration_caches(Settings(**values))
        assert not rules.writable and cache.writable
        return rules.path, cache.path

    assert paths(calibration_cache="off") == (None, None)
    assert paths(calibration_cache="") == (None, calibration.default_cache_path())
    assert paths(calibration_cache="~/rules.json") == (None, Path.home() / "rules.json")
    assert paths(calibration_rules="~/known.json", calibration_cache="off") == (Path.home() / "known.json", None)
