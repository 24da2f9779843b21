"""Model repository loading: config.json vs session validation, readiness, providers, threads."""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import onnxruntime as ort
import pytest
from fastapi.testclient import TestClient

from posenc.service.http.app import create_app
from posenc.service.inference.runtime.engine import Engine, run_model
from posenc.service.inference.runtime.repository import CPU, CUDA, intra_op_threads, resolve_providers
from posenc.service.settings import Settings
from tests.onnx_models import REPOSITORY, random_inputs

# Whether this onnxruntime build has the CUDA provider at all (onnxruntime-gpu). It says nothing about a
# device: onnxruntime-gpu lists CUDA on a machine without a GPU too. `cuda_device` probes that.
CUDA_BUILT_IN = CUDA in ort.get_available_providers()


@functools.cache
def cuda_device() -> tuple[bool, str]:
    """(usable, why): whether onnxruntime really runs a session on a CUDA device; probed once per run.

    The shipped model is opened with the CUDA provider first (no onnx library needed, so this runs
    without the export extra); onnxruntime either raises or silently falls back to the CPU when the
    provider cannot start (no device, no driver, missing CUDA/cuDNN libraries), so only CUDA in
    `session.get_providers()` counts.
    """
    if not CUDA_BUILT_IN:
        return False, f"this onnxruntime ({ort.get_device()}) has no {CUDA}: install onnxruntime-gpu"
    model = (REPOSITORY / "rope_attention" / "model.onnx").read_bytes()
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the probe's own failure is the answer, not noise in the test log
    try:
        session = ort.InferenceSession(model, sess_options=options, providers=[CUDA, CPU])
    except Exception as exc:  # onnxruntime raises RuntimeError / its own Fail types when CUDA cannot start
        return False, f"{CUDA} is built in but a session on it failed: {exc}"
    if CUDA not in session.get_providers():
        return False, f"{CUDA} is built in but onnxruntime fell back to {session.get_providers()} (no CUDA device?)"
    return True, "a session runs on CUDAExecutionProvider"


def require_cuda_device() -> None:
    usable, why = cuda_device()
    if not usable:
        pytest.skip(f"needs onnxruntime-gpu and a usable CUDA device: {why}")


def _copy_repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPOSITORY / "rope_attention", repo / "rope_attention")
    return repo


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.fixture
def broken_repo(tmp_path: Path) -> Path:
    repo = _copy_repository(tmp_path)
    shutil.copytree(REPOSITORY / "rope_attention", repo / "broken")
    config = json.loads((repo / "broken" / "config.json").read_text())
    config["inputs"][1]["shape"] = [-1, 4, -1, 64]  # the graph has 8 kv heads
    (repo / "broken" / "config.json").write_text(json.dumps(config))
    return repo


@pytest.fixture
def broken_client(broken_repo: Path) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model_repository=broken_repo))) as client:
        yield client


def test_shipped_repository_loads(tmp_path: Path) -> None:
    engine = Engine(Settings(model_repository=REPOSITORY, providers="cpu", intra_op_num_threads=2))
    assert engine.load() == []
    assert set(engine.models) >= {"rope_attention", "llama3_1_attention"}
    model = engine.models["rope_attention"]
    assert model.ready and model.providers == [CPU]
    assert model.session is not None and model.session.get_session_options().intra_op_num_threads == 2
    out = run_model(model, random_inputs(8, 8, 64, 2, 3))["output"]
    assert out.shape == (2, 8, 3, 64)


def test_config_mismatch_makes_readiness_fail_with_the_reason(broken_client: TestClient) -> None:
    for path in ("/readyz", "/v2/health/ready", "/v2/models/broken/ready", "/v2/models/broken/versions/1/ready"):
        r = broken_client.get(path)
        assert r.status_code == 503, path
        assert "input 'key': config.json says FP32 [-1, 4, -1, 64], model.onnx has tensor(float) [-1, 8, -1, 64]" \
            in r.text, path
    assert broken_client.get("/v2/models/rope_attention/ready").status_code == 200
    meta = broken_client.get("/v2/models/broken").json()
    assert meta["ready"] is False and "config.json says" in meta["problem"]
    r = broken_client.post("/v2/models/broken/infer", content=b"{}")
    assert r.status_code == 503 and "not ready" in r.json()["error"] and r.headers["Retry-After"]


@pytest.mark.parametrize(("change", "reason"), [
    ({"sha256": "0" * 64}, "does not match the sha256"),
    ({"max_batch_size": 0}, "max_batch_size must be an integer >= 1"),
    ({"inputs": [{"name": "query"}]}, "need name, datatype and shape"),
    ({"outputs": [{"name": "out", "datatype": "FP32", "shape": [-1, 8, -1, 64]}]}, "outputs differ"),
])
def test_bad_config_is_a_readiness_problem(tmp_path: Path, change: dict, reason: str) -> None:
    repo = _copy_repository(tmp_path)
    _edit_config(repo / "rope_attention", **change)
    problems = Engine(Settings(model_repository=repo)).load()
    assert len(problems) == 1 and reason in problems[0] and "rope_attention" in problems[0]


def test_corrupt_model_file_is_a_readiness_problem(tmp_path: Path) -> None:
    repo = _copy_repository(tmp_path)
    (repo / "rope_attention" / "model.onnx").write_bytes(b"not an onnx model")
    _edit_config(repo / "rope_attention", sha256=None)
    problems = Engine(Settings(model_repository=repo)).load()
    assert len(problems) == 1 and problems[0].startswith("model 'rope_attention': ")


def test_config_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    repo = _copy_repository(tmp_path)
    (repo / "rope_attention" / "config.json").write_text('{"name": "rope_attention", "inputs": [')
    problems = Engine(Settings(model_repository=repo)).load()
    assert len(problems) == 1 and "config.json is not valid JSON" in problems[0]


def test_missing_config_and_empty_repository(tmp_path: Path) -> None:
    repo = _copy_repository(tmp_path)
    (repo / "rope_attention" / "config.json").unlink()
    assert "config.json" in Engine(Settings(model_repository=repo)).load()[0]
    shutil.copy(REPOSITORY / "rope_attention" / "config.json", repo / "rope_attention")
    (repo / "rope_attention" / "model.onnx").unlink()
    assert "model.onnx" in Engine(Settings(model_repository=repo)).load()[0]
    (tmp_path / "empty").mkdir()
    assert "holds no" in Engine(Settings(model_repository=tmp_path / "empty")).load()[0]
    assert "not a folder" in Engine(Settings(model_repository=tmp_path / "nowhere")).load()[0]


@pytest.mark.skipif(CUDA_BUILT_IN, reason="this onnxruntime has the CUDA provider (onnxruntime-gpu)")
def test_providers_without_cuda(tmp_path: Path) -> None:
    assert resolve_providers("auto") == [CPU] and resolve_providers("cpu") == [CPU]
    problems = Engine(Settings(model_repository=_copy_repository(tmp_path), providers="cuda")).load()
    assert "onnxruntime-gpu" in problems[0]


def test_providers_cuda_built_in_without_a_device(tmp_path: Path) -> None:
    """onnxruntime-gpu on a machine where CUDA cannot start: providers=cuda is a readiness problem."""
    if not CUDA_BUILT_IN:
        pytest.skip("this onnxruntime has no CUDA provider (test_providers_without_cuda covers it)")
    if cuda_device()[0]:
        pytest.skip("a CUDA device is usable (test_providers_with_cuda covers it)")
    problems = Engine(Settings(model_repository=_copy_repository(tmp_path), providers="cuda")).load()
    assert len(problems) == 1 and "could not use a CUDA device" in problems[0]


def test_providers_with_cuda(tmp_path: Path) -> None:
    require_cuda_device()
    engine = Engine(Settings(model_repository=_copy_repository(tmp_path), providers="cuda"))
    assert engine.load() == []
    assert engine.models["rope_attention"].providers[0] == CUDA


def test_intra_op_threads_are_explicit() -> None:
    assert intra_op_threads(3) == 3 and intra_op_threads(0) >= 1


def test_model_metadata_reports_providers_and_config() -> None:
    with TestClient(create_app(Settings(providers="cpu"))) as client:
        meta = client.get("/v2/models/llama3_1_attention").json()
    assert meta["providers"] == [CPU] and meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"][1] == {"name": "key", "datatype": "FP32", "shape": [-1, 8, -1, 128]}
    assert meta["parameters"]["rope"]["rope_type"] == "llama3" and meta["parameters"]["max_batch_size"] == 8
