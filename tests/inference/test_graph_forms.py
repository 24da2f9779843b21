"""The shipped models' CPU forms (model.cpu.onnx: GroupQueryAttention; model.blocked<N>.onnx: query blocks): the
same outputs as model.onnx, loaded beside it on the CPU, and chosen by sequence length by the model's rule, the
same graph for the same request every time."""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from posenc.models.graph_rule import cpu_forms_of
from posenc.service.inference.runtime.engine import Engine, run_model
from posenc.service.inference.runtime.graph_forms import STANDARD, GraphForms
from posenc.service.inference.runtime.repository import LoadedModel
from posenc.service.settings import Settings
from tests.onnx_models import REPOSITORY, SHIPPED, geometry, random_inputs, run, session

# (B, S, first position): one token, odd lengths, rows that start far along, longer than the blocks
SHAPES = [(1, 1, 0), (2, 7, 3), (3, 33, 100), (1, 130, 5000)]
FORM_FILES = ("model.cpu.onnx", "model.blocked4.onnx", "model.blocked8.onnx", "model.blocked16.onnx")
RULE = [(1, STANDARD), (8, "model.blocked4.onnx"), (32, "model.blocked16.onnx"), (100, "model.cpu.onnx")]


def _config(model: str) -> dict:
    return json.loads((REPOSITORY / model / "config.json").read_text())


@pytest.mark.parametrize("model", SHIPPED)
def test_every_shipped_model_has_the_cpu_forms_config_json_describes(model: str) -> None:
    forms, rule = cpu_forms_of(_config(model))
    assert [form.file for form in forms] == list(FORM_FILES)
    assert [form.form for form in forms] == ["gqa", "blocked4", "blocked8", "blocked16"]
    for form, entry in zip(forms, _config(model)["cpu_forms"], strict=True):
        assert hashlib.sha256((REPOSITORY / model / form.file).read_bytes()).hexdigest() == form.sha256
        assert "Attention" not in entry["ops"]  # the standard node is gone from every form
    assert _config(model)["cpu_forms"][0]["ops"]["GroupQueryAttention"] == 1
    assert rule is not None and rule[0][0] == 1


@pytest.mark.parametrize("model", SHIPPED)
@pytest.mark.parametrize("file", FORM_FILES)
@pytest.mark.parametrize(("batch", "seq", "start"), SHAPES)
def test_every_cpu_form_answers_what_model_onnx_answers(model: str, file: str, batch: int, seq: int,
                                                        start: int) -> None:
    inputs = random_inputs(*geometry(model), batch, seq, start=start)
    standard = run(session(REPOSITORY / model / STANDARD), inputs)
    np.testing.assert_allclose(run(session(REPOSITORY / model / file), inputs), standard, atol=1e-5, rtol=1e-5)


def _repository_copy(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPOSITORY / "rope_attention", repo / "rope_attention")
    return repo


def _edit_config(repo: Path, change) -> None:  # type: ignore[no-untyped-def]
    path = repo / "rope_attention" / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def _set_rule(rule: list[tuple[int, str]]):  # type: ignore[no-untyped-def]
    return lambda config: config.update(cpu_rule=[{"from_sequence": s, "file": f} for s, f in rule])


def test_the_engine_runs_each_length_on_the_graph_its_rule_names(tmp_path: Path) -> None:
    """A rule over four graphs, seen in the bits: every run equals the graph the rule names run alone, and a
    request asked twice gets the same bits."""
    repo = _repository_copy(tmp_path)
    _edit_config(repo, _set_rule(RULE))
    engine = Engine(Settings(model_repository=repo, intra_op_num_threads=1, cpu_form_from="config"))
    assert engine.load() == []
    model = engine.models["rope_attention"]
    assert isinstance(model, LoadedModel) and model.forms is not None and list(model.forms.rule) == RULE
    alone = {file: session(repo / "rope_attention" / file) for _, file in RULE}
    expected = {1: STANDARD, 7: STANDARD, 8: "model.blocked4.onnx", 31: "model.blocked4.onnx",
                32: "model.blocked16.onnx", 99: "model.blocked16.onnx", 100: "model.cpu.onnx"}

    async def scenario() -> None:
        for seq, file in expected.items():
            inputs = random_inputs(8, 8, 64, 1, seq, seed=seq)
            assert model.forms is not None and model.forms.pick(inputs)[0] == file
            first = (await engine.infer(model, inputs))["output"]
            np.testing.assert_array_equal(first, run(alone[file], inputs))
            np.testing.assert_array_equal((await engine.infer(model, inputs))["output"], first)
        await engine.close()

    asyncio.run(scenario())
    np.testing.assert_array_equal(run_model(model, random_inputs(8, 8, 64, 1, 3))["output"],
                                  run(alone[STANDARD], random_inputs(8, 8, 64, 1, 3)))


def test_a_rule_picks_by_length() -> None:
    forms = GraphForms({}, RULE, {"query": 2})
    assert [forms.file_for(seq) for seq in (0, 1, 7, 8, 31, 32, 100, 10**6)] == [
        STANDARD, STANDARD, STANDARD, "model.blocked4.onnx", "model.blocked4.onnx", "model.blocked16.onnx",
        "model.cpu.onnx", "model.cpu.onnx"]
    assert forms.describe().startswith("model.onnx from 1, model.blocked4.onnx from 8")


def _entry(index: int, **changes: object):  # type: ignore[no-untyped-def]
    return lambda config: config["cpu_forms"][index].update(changes)


@pytest.mark.parametrize(("change", "reason"), [
    (_entry(1, sha256="0" * 64), "model.blocked4.onnx does not match the sha256 in config.json"),
    (_entry(0, file="../rope_attention/model.cpu.onnx"), "every cpu_forms entry must name a file in the model's"),
    (_entry(2, file="missing.onnx"), "model 'rope_attention'"),
    (_entry(2, file="model.onnx"), "cpu_forms must name each file once, and not model.onnx"),
    (_set_rule([(2, STANDARD)]), "cpu_rule must be [{from_sequence, file}, ...] ascending from 1"),
    (_set_rule([(1, STANDARD), (1, "model.cpu.onnx")]), "cpu_rule must be"),
    (_set_rule([(1, STANDARD), (64, "model.blocked32.onnx")]), "over model.onnx and the files of cpu_forms"),
    (lambda config: config.update(cpu_forms={"gqa": "model.cpu.onnx"}), "cpu_forms must be a list"),
])
def test_a_bad_cpu_forms_entry_is_a_readiness_problem(tmp_path: Path, change, reason: str) -> None:  # type: ignore[no-untyped-def]
    repo = _repository_copy(tmp_path)
    _edit_config(repo, change)
    problems = Engine(Settings(model_repository=repo)).load()
    assert len(problems) == 1 and reason in problems[0], problems


def _one_form_export(config: dict) -> None:
    """config.json as an earlier export wrote it: one CPU form, `cpu_model`, with the length it wins from."""
    gqa = config.pop("cpu_forms")[0]
    config.pop("cpu_rule")
    config["cpu_model"] = {"file": gqa["file"], "sha256": gqa["sha256"], "from_sequence": 64, "ops": gqa["ops"]}


def test_an_earlier_exports_one_cpu_form_is_still_served_from_its_length(tmp_path: Path) -> None:
    repo = _repository_copy(tmp_path)
    _edit_config(repo, _one_form_export)
    engine = Engine(Settings(model_repository=repo, cpu_form_from="config"))
    assert engine.load() == []
    model = engine.models["rope_attention"]
    assert isinstance(model, LoadedModel) and model.forms is not None
    assert list(model.forms.rule) == [(1, STANDARD), (64, "model.cpu.onnx")]
    assert sorted(model.forms.sessions) == ["model.cpu.onnx", STANDARD]


@pytest.mark.parametrize("from_sequence", [0, "64", True])
def test_an_earlier_exports_bad_length_is_a_readiness_problem(tmp_path: Path, from_sequence: object) -> None:
    repo = _repository_copy(tmp_path)
    _edit_config(repo, _one_form_export)
    _edit_config(repo, lambda config: config["cpu_model"].update(from_sequence=from_sequence))
    problems = Engine(Settings(model_repository=repo)).load()
    assert len(problems) == 1 and "from_sequence >= 1 (or null)" in problems[0], problems


def test_a_model_without_cpu_forms_runs_model_onnx_only(tmp_path: Path) -> None:
    repo = _repository_copy(tmp_path)
    _edit_config(repo, lambda config: (config.pop("cpu_forms"), config.pop("cpu_rule")))
    for file in FORM_FILES:
        (repo / "rope_attention" / file).unlink()
    engine = Engine(Settings(model_repository=repo))
    assert engine.load() == []
    model = engine.models["rope_attention"]
    assert isinstance(model, LoadedModel) and model.forms is None
