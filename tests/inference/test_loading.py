"""The server listens before its models are loaded: tables answer at once, each model is not ready (503 with
Retry-After) until its CPU graphs are chosen, and a calibration runs in a child process inside the memory
budget (`Engine.load_in_background`, `calibration_child`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from posenc.service.http.app import create_app
from posenc.service.inference.runtime import calibration_child, repository
from posenc.service.inference.runtime.calibration import Timings, config_inputs
from posenc.service.inference.runtime.calibration_child import CHILD_BYTES, measure_apart, run_child
from posenc.service.inference.runtime.repository import LoadedModel
from posenc.service.settings import Settings
from posenc.service.testing import attention_inputs, kserve_request
from tests.onnx_models import REPOSITORY


def _repository(tmp_path: Path, *models: str) -> Path:
    for model in models:
        shutil.copytree(REPOSITORY / model, tmp_path / "repo" / model)
    return tmp_path / "repo"


@pytest.fixture
def held_calibration(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Each calibration waits for `release` and reports how much of the memory budget was reserved meanwhile."""
    state: dict[str, Any] = {"release": threading.Event(), "started": threading.Event(), "calls": 0}

    def measure(graphs: Any, inputs: Any, threads: int, deadline: float) -> Timings | None:
        state["calls"] += 1
        state["started"].set()
        state["release"].wait(30)
        return None  # out of time: config.json's rule

    monkeypatch.setattr(repository, "measure_apart", measure)
    yield state
    state["release"].set()


def test_tables_answer_while_a_model_calibrates_and_the_model_answers_503_until_chosen(
        tmp_path: Path, held_calibration: dict[str, Any]) -> None:
    settings = Settings(model_repository=_repository(tmp_path, "rope_attention"), cpu_form_from="calibrate",
                        calibration_cache="off", intra_op_num_threads=1)
    app = create_app(settings, load_in_background=True)
    request = kserve_request(attention_inputs(8, 8, 64, 1, 16), content_type=True)
    with TestClient(app) as client:
        assert held_calibration["started"].wait(10)
        assert client.get("/v1/rope", params={"max_position": 4, "head_dim": 8}).status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "rope_attention" in ready.json()["error"]
        assert "loading" in ready.json()["error"]
        # the calibration child's share of the memory budget is held while it runs
        assert app.state.process.memory_budget.reserved == CHILD_BYTES
        infer = client.post("/v2/models/rope_attention/infer", content=request.body, headers=request.headers)
        assert infer.status_code == 503 and infer.headers["Retry-After"] == "2"
        assert "is loading" in infer.json()["error"]
        model_ready = client.get("/v2/models/rope_attention/ready")
        assert model_ready.status_code == 503
        index = client.post("/v2/repository/index").json()
        assert index == [{"name": "rope_attention", "version": "1", "state": "LOADING",
                          "reason": index[0]["reason"]}]
        held_calibration["release"].set()
        for _ in range(200):
            if client.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.05)
        assert client.get("/readyz").status_code == 200
        assert app.state.process.memory_budget.reserved == 0
        infer = client.post("/v2/models/rope_attention/infer", content=request.body, headers=request.headers)
        assert infer.status_code == 200
    assert held_calibration["calls"] == 1


def test_an_in_process_app_has_its_models_loaded_when_its_lifespan_has_started(tmp_path: Path) -> None:
    settings = Settings(model_repository=_repository(tmp_path, "rope_attention"), cpu_form_from="config")
    with TestClient(create_app(settings)) as client:
        assert client.get("/readyz").status_code == 200


def test_only_the_graphs_the_rule_names_get_a_session(tmp_path: Path) -> None:
    settings = Settings(model_repository=_repository(tmp_path, "rope_attention"), cpu_form_from="64")
    with TestClient(create_app(settings)) as client:
        model = client.app.state.process.engine.models["rope_attention"]  # type: ignore[attr-defined]
    assert isinstance(model, LoadedModel) and model.forms is not None
    assert set(model.forms.sessions) == {"model.onnx", "model.cpu.onnx"}  # not the three blocked forms


def test_the_child_times_every_graph_within_its_share_of_memory() -> None:
    """The shipped model with the most heads (32: the largest attention at S=1024) on two threads."""
    folder = REPOSITORY / "llama3_1_attention"
    graphs = {file: folder / file for file in ("model.onnx", "model.cpu.onnx", "model.blocked4.onnx",
                                                "model.blocked8.onnx", "model.blocked16.onnx")}
    inputs = [("query", "FP32", [-1, 32, -1, 128], 2), ("key", "FP32", [-1, 8, -1, 128], 2),
              ("value", "FP32", [-1, 8, -1, 128], 2), ("position_ids", "INT64", [-1, -1], 1)]
    answer = run_child(graphs, inputs, threads=2, seconds=120)
    assert answer is not None and set(answer["seconds"]) == set(graphs)
    assert answer["sequences"][-1] == 1024
    assert 0 < answer["peak_bytes"] < CHILD_BYTES, answer["peak_bytes"]


def test_the_child_imports_nothing_from_the_servers_directory_or_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A json.py in the server's working directory and on its PYTHONPATH (it leaves a marker when imported) is not
    what the child imports: the child runs isolated (-I), in /, with only the variables it needs; a graph's path
    relative to the server's directory still reaches it."""
    work, marker = tmp_path / "work", tmp_path / "imported"
    work.mkdir()
    (work / "json.py").write_text(f"open({str(marker)!r}, 'a').write('json.py imported')\n")
    monkeypatch.chdir(work)
    monkeypatch.setenv("PYTHONPATH", str(work))
    monkeypatch.setenv("POSENC_RESTRICTED_API", "statistics:x-key=secret")
    started: list[dict[str, Any]] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(kwargs)
        return popen(*args, **kwargs)

    monkeypatch.setattr(calibration_child.subprocess, "Popen", recorded)
    folder = REPOSITORY / "rope_attention"
    inputs = config_inputs(json.loads((folder / "config.json").read_text()))
    answer = run_child({"model.onnx": Path(os.path.relpath(folder / "model.onnx"))}, inputs, threads=1, seconds=60)
    assert not marker.exists()
    assert answer is not None and answer["sequences"][-1] == 1024
    (kwargs,) = started
    assert kwargs["cwd"] == "/" and "PYTHONPATH" not in kwargs["env"] and "POSENC_RESTRICTED_API" not in kwargs["env"]
    assert set(kwargs["env"]) <= set(os.environ) and "PATH" in kwargs["env"]


def test_a_child_out_of_time_or_failing_is_config_json(tmp_path: Path) -> None:
    folder = REPOSITORY / "rope_attention"
    inputs = [("query", "FP32", [-1, 8, -1, 64], 2)]
    assert measure_apart({"model.onnx": folder / "model.onnx"}, inputs, 1, deadline=0) is None
    (tmp_path / "model.onnx").write_bytes(b"not onnx")
    import time

    assert measure_apart({"model.onnx": tmp_path / "model.onnx"}, inputs, 1, time.monotonic() + 30) is None
    assert not calibration_child._running


def test_rules_printed_on_this_machine_are_read_from_the_rules_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from posenc.service.cli.main import main

    repo = _repository(tmp_path, "rope_attention")
    (tmp_path / "other.json").write_text('{"another machine | key": {"rule": [[1, "model.onnx"]]}}')
    monkeypatch.setenv("POSENC_INTRA_OP_NUM_THREADS", "1")
    assert main(["calibrate", "--repository", str(repo), "--print", "--merge", str(tmp_path / "other.json")]) == 0
    printed = capsys.readouterr()
    assert "rope_attention:" in printed.err and "rope_attention" not in printed.out  # the table on stderr
    rules = tmp_path / "rules.json"
    rules.write_text(printed.out)
    entries = json.loads(printed.out)
    assert "another machine | key" in entries and len(entries) == 2

    def never(*args: Any) -> None:
        raise AssertionError("measured although the rules file names this machine")

    monkeypatch.setattr(repository, "measure_apart", never)
    settings = Settings(model_repository=repo, cpu_form_from="calibrate", calibration_cache="off",
                        calibration_rules=str(rules), intra_op_num_threads=1)
    with TestClient(create_app(settings, load_in_background=True)) as client:
        for _ in range(200):
            if client.get("/readyz").status_code == 200:
                break
            threading.Event().wait(0.05)
        model = client.app.state.process.engine.models["rope_attention"]  # type: ignore[attr-defined]
    assert isinstance(model, LoadedModel) and model.forms is not None
    assert model.forms.how == "calibrated for this machine (POSENC_CALIBRATION_RULES)"
    (key,) = [key for key in entries if key != "another machine | key"]
    assert [tuple(step) for step in entries[key]["rule"]] == list(model.forms.rule)
    assert rules.read_text() == printed.out  # never written
