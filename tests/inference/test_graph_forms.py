"""The shipped models' CPU forms (model.cpu.onnx: attention as onnxruntime's GroupQueryAttention): the same
outputs as model.onnx, loaded beside it on the CPU, and chosen by sequence length, the same graph for the
same request every time."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from posenc.service.inference.engine import Engine, run_model
from posenc.service.inference.graph_forms import STANDARD
from posenc.service.inference.repository import LoadedModel, cpu_model_file
from posenc.service.settings import Settings
from tests.onnx_models import REPOSITORY, SHIPPED, geometry, random_inputs, run, session

# (B, S, first position): one token, odd lengths, rows that start far along, longer than most models' switch
SHAPES = [(1, 1, 0), (2, 7, 3), (3, 33, 100), (1, 130, 5000)]


def _config(model: str) -> dict:
    return json.loads((REPOSITORY / model / "config.json").read_text())


@pytest.mark.parametrize("model", SHIPPED)
def test_every_shipped_model_has_a_cpu_form_that_config_json_describes(model: str) -> None:
    entry = cpu_model_file(_config(model))
    assert entry is not None
    file, sha256, from_sequence = entry
    assert hashlib.sha256((REPOSITORY / model / file).read_bytes()).hexdigest() == sha256
    assert from_sequence >= 1 and _config(model)["cpu_model"]["ops"]["GroupQueryAttention"] == 1


@pytest.mark.parametrize("model", SHIPPED)
@pytest.mark.parametrize(("batch", "seq", "start"), SHAPES)
def test_the_cpu_form_answers_what_model_onnx_answers(model: str, batch: int, seq: int, start: int) -> None:
    inputs = random_inputs(*geometry(model), batch, seq, start=start)
    standard = run(session(REPOSITORY / model / "model.onnx"), inputs)
    cpu_form = run(session(REPOSITORY / model / "model.cpu.onnx"), inputs)
    np.testing.assert_allclose(cpu_form, standard, atol=1e-5, rtol=1e-5)


def test_the_engine_runs_long_sequences_on_the_cpu_form_and_short_ones_on_model_onnx() -> None:
    """rope_attention's rule from config.json, seen in the bits: every run equals the graph the rule names
    run alone, and a request asked twice gets the same bits."""
    engine = Engine(Settings(model_repository=REPOSITORY, intra_op_num_threads=1))
    assert engine.load() == []
    model = engine.models["rope_attention"]
    assert isinstance(model, LoadedModel) and model.forms is not None
    from_sequence = model.forms.from_sequence
    files = {STANDARD: session(REPOSITORY / "rope_attention" / STANDARD),
             "model.cpu.onnx": session(REPOSITORY / "rope_attention" / "model.cpu.onnx")}

    async def scenario() -> None:
        for seq, expected_file in ((from_sequence - 1, STANDARD), (from_sequence, "model.cpu.onnx")):
            inputs = random_inputs(8, 8, 64, 1, seq, seed=seq)
            assert model.forms is not None and model.forms.pick(inputs)[0] == expected_file
            first = (await engine.infer(model, inputs))["output"]
            np.testing.assert_array_equal(first, run(files[expected_file], inputs))
            np.testing.assert_array_equal((await engine.infer(model, inputs))["output"], first)
        await engine.close()

    asyncio.run(scenario())
    np.testing.assert_array_equal(run_model(model, random_inputs(8, 8, 64, 1, 3))["output"],
                                  run(files[STANDARD], random_inputs(8, 8, 64, 1, 3)))


def _repository_copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPOSITORY / "rope_attention", repo / "rope_attention")
    return repo


def _edit_cpu_model(repo: Path, **changes: object) -> None:
    path = repo / "rope_attention" / "config.json"
    config = json.loads(path.read_text())
    config["cpu_model"].update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(("change", "reason"), [
    ({"sha256": "0" * 64}, "model.cpu.onnx does not match the sha256 in config.json"),
    ({"from_sequence": 0}, "cpu_model must name a file in the model's folder and a from_sequence >= 1 (or null)"),
    ({"file": "../rope_attention/model.cpu.onnx"}, "cpu_model must name a file in the model's folder"),
    ({"file": "missing.onnx"}, "model 'rope_attention'"),
])
def test_a_bad_cpu_form_entry_is_a_readiness_problem(tmp_path: Path, change: dict, reason: str) -> None:
    repo = _repository_copy(tmp_path)
    _edit_cpu_model(repo, **change)
    problems = Engine(Settings(model_repository=repo)).load()
    assert len(problems) == 1 and reason in problems[0], problems


def test_a_model_without_a_cpu_form_runs_model_onnx_only(tmp_path: Path) -> None:
    repo = _repository_copy(tmp_path)
    path = repo / "rope_attention" / "config.json"
    config = json.loads(path.read_text())
    del config["cpu_model"]
    path.write_text(json.dumps(config))
    (repo / "rope_attention" / "model.cpu.onnx").unlink()
    engine = Engine(Settings(model_repository=repo))
    assert engine.load() == []
    model = engine.models["rope_attention"]
    assert isinstance(model, LoadedModel) and model.forms is None
