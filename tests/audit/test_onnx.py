"""ONNX graphs: onnxruntime-genai's cos_cache / sin_cache shape and an in-graph inv_freq; the shipped graphs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from posenc.models.rope import inv_freq_and_attention_factor, rope_cos_sin
from posenc.models.rope_config import rope_parameters_from_config
from posenc.models.rope_frequencies import default_inv_freq
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import SMALL_LLAMA3, caches_of, genai_onnx, inv_freq_onnx

ROOT = Path(__file__).resolve().parents[2]
PARAMS, _ = rope_parameters_from_config(SMALL_LLAMA3)


def _write(tmp_path: Path, data: bytes, name: str = "model.onnx") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _half(params: object, rows: int, dtype: object = np.float16) -> tuple[np.ndarray, np.ndarray]:
    cos, sin, _ = rope_cos_sin(params, rows, form="half", dtype=np.float64)  # type: ignore[arg-type]
    return cos.astype(dtype), sin.astype(dtype)


@pytest.mark.parametrize("op", ["GroupQueryAttention", "RotaryEmbedding", "RotaryEmbedding23"])
def test_builder_caches_correct_pass(tmp_path: Path, op: str) -> None:
    cos, sin = caches_of(SMALL_LLAMA3, 2048)
    result = audit_file(_write(tmp_path, genai_onnx(cos, sin, op=op)), config=SMALL_LLAMA3)
    assert result.verdict == "correct", result.document()["facts"]


def _bugs() -> dict[str, tuple[np.ndarray, np.ndarray, int]]:
    cos, sin = caches_of(SMALL_LLAMA3, 2048)
    theta = _half(dataclasses.replace(PARAMS, rope_theta=10000.0), 2048)
    unscaled = _half(dataclasses.replace(PARAMS, rope_type="default"), 2048)
    f64 = _half(PARAMS, 2048, np.float64)
    bf = (f64[0].astype(ml_dtypes.bfloat16).astype(np.float16), f64[1].astype(ml_dtypes.bfloat16).astype(np.float16))
    return {
        "cache_shorter_than_context": (cos[:1024], sin[:1024], 0),
        "cos_sin_swapped": (sin, cos, 0),
        "theta": (*theta, 0),
        "scaling_not_applied": (*unscaled, 0),
        "cache_rounded_twice": (*bf, 0),
        "interleaved_vs_half": (cos, sin, 1),
    }


@pytest.mark.parametrize("bug", list(_bugs()))
def test_builder_cache_bugs_are_named(tmp_path: Path, bug: str) -> None:
    cos, sin, interleaved = _bugs()[bug]
    result = audit_file(_write(tmp_path, genai_onnx(cos, sin, interleaved=interleaved)), config=SMALL_LLAMA3)
    assert result.verdict == "wrong" and bug in mistakes(result), result.document()["facts"]


def test_without_a_reference_the_caches_are_checked_against_themselves(tmp_path: Path) -> None:
    plain_config = {**SMALL_LLAMA3, "rope_scaling": None, "rope_theta": 10000.0}
    result = audit_file(_write(tmp_path, genai_onnx(*caches_of(plain_config, 512))))
    notes = {f.name: f.found for f in result.facts if f.verdict == "note"}
    assert result.verdict == "consistent" and notes == {"cache base": "plain RoPE, base 10000"}
    scaled = audit_file(_write(tmp_path, genai_onnx(*caches_of(SMALL_LLAMA3, 512))))
    assert scaled.verdict == "consistent"
    assert {f.found for f in scaled.facts if f.verdict == "note"} == {"not plain RoPE of one base"}


def test_external_data_is_read_for_the_caches_only(tmp_path: Path) -> None:
    import onnx

    from tests.conftest import running_client

    cos, sin = caches_of(SMALL_LLAMA3, 1024)  # shorter than the context: the values must have been read
    model = onnx.load_model_from_string(genai_onnx(cos, sin))
    path = tmp_path / "model.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    assert path.stat().st_size < 4096 < (tmp_path / "model.onnx.data").stat().st_size
    result = audit_file(path, config=SMALL_LLAMA3)
    assert mistakes(result) == {"cache_shorter_than_context"}
    with running_client() as client:
        answer = client.post("/v1/audit", content=path.read_bytes())
    assert answer.status_code == 400 and "is stored in an external data file; audit the model with `posenc audit` " \
        "beside its data" in answer.json()["error"]


def test_in_graph_inv_freq(tmp_path: Path) -> None:
    inv_freq, _ = inv_freq_and_attention_factor(PARAMS)
    good = audit_file(_write(tmp_path, inv_freq_onnx(inv_freq)), config=SMALL_LLAMA3)
    assert good.verdict == "correct"
    plain = default_inv_freq(500000.0, PARAMS.rotary_dim).astype(np.float32)
    assert mistakes(audit_file(_write(tmp_path, inv_freq_onnx(plain)), config=SMALL_LLAMA3)) == {"scaling_missing"}
    wrong_theta, _ = inv_freq_and_attention_factor(dataclasses.replace(PARAMS, rope_theta=10000.0))
    result = audit_file(_write(tmp_path, inv_freq_onnx(wrong_theta)), config=SMALL_LLAMA3)
    assert mistakes(result) == {"wrong_theta"} and "10000" in result.document()["facts"][-1]["explanation"]


def test_in_graph_attention_factor(tmp_path: Path) -> None:
    config = {"model_type": "qwen2", "hidden_size": 512, "num_attention_heads": 8, "max_position_embeddings": 4096,
              "rope_theta": 1e6, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                  "original_max_position_embeddings": 1024}}
    params, _ = rope_parameters_from_config(config)
    inv_freq, factor = inv_freq_and_attention_factor(params)
    assert audit_file(_write(tmp_path, inv_freq_onnx(inv_freq, factor)), config=config).verdict == "correct"
    assert mistakes(audit_file(_write(tmp_path, inv_freq_onnx(inv_freq)), config=config)) == \
        {"attention_factor_missing"}


@pytest.mark.parametrize("model", sorted(p.name for p in (ROOT / "onnx").iterdir() if (p / "config.json").exists()))
@pytest.mark.parametrize("form", ["model.onnx", "model.cpu.onnx"])
def test_shipped_graphs_pass_against_their_config(model: str, form: str) -> None:
    folder = ROOT / "onnx" / model
    if not (folder / form).exists():
        pytest.skip(f"{model} has no {form}")
    result = audit_file(folder / form, config=json.loads((folder / "config.json").read_text()))
    assert result.verdict == "correct", result.document()["facts"]
    assert result.divergence is not None and result.divergence.within_contract


@pytest.mark.parametrize("case", ["lengths differ", "empty", "one row"])
def test_caches_that_are_no_pair_are_not_read_as_one(tmp_path: Path, case: str) -> None:
    """cos/sin initializers of different shapes, empty, or without rows are no cache pair: the audit says the
    rotary dimension is missing, never fails on them."""
    cos, sin = caches_of(SMALL_LLAMA3, 2048)
    pair = {"lengths differ": (cos, sin[:1024]), "empty": (cos[:0], sin[:0]), "one row": (cos[0], sin[0])}[case]
    result = audit_file(_write(tmp_path, genai_onnx(*pair, op="RotaryEmbedding")), config=SMALL_LLAMA3)
    facts = {fact.name: fact for fact in result.facts}
    assert result.verdict == "wrong" and facts["rotary_dim"].verdict == "missing"


def _edited(data: bytes, edit: Any) -> bytes:
    import onnx

    model = onnx.load_model_from_string(data)
    edit(model)
    return model.SerializeToString()


def test_a_rotary_node_without_its_cache_inputs_is_skipped(tmp_path: Path) -> None:
    cos, sin = caches_of(SMALL_LLAMA3, 2048)
    short = _edited(genai_onnx(cos, sin, op="RotaryEmbedding"), lambda model: model.graph.node[0].input.pop())
    result = audit_file(_write(tmp_path, short), config=SMALL_LLAMA3)
    assert {fact.name: fact.verdict for fact in result.facts}["rotary_dim"] == "missing"


def test_packed_batching_is_noted(tmp_path: Path) -> None:
    from onnx import helper

    cos, sin = caches_of(SMALL_LLAMA3, 2048)
    packed = _edited(genai_onnx(cos, sin, op="RotaryEmbedding"),
                     lambda model: model.graph.node[0].attribute.append(helper.make_attribute("is_packed_batching", 1)))
    result = audit_file(_write(tmp_path, packed), config=SMALL_LLAMA3)
    assert "is_packed_batching" in json.dumps(result.document())


def test_nodes_and_nesting_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain of 10 local functions (none recursive) nests past MAX_DEPTH; a graph of more nodes than MAX_NODES
    is refused too."""
    from onnx import TensorProto, helper

    from posenc.service.errors import BadRequest

    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    functions = [helper.make_function("local", f"f{i}", ["x"], ["y"],
                                      [helper.make_node(f"f{i + 1}" if i < 10 else "Identity", ["x"], ["y"],
                                                        domain="local" if i < 10 else "")], opsets)
                 for i in range(11)]
    graph = helper.make_graph([helper.make_node("f0", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    chain = _write(tmp_path, helper.make_model(graph, functions=functions, opset_imports=opsets).SerializeToString())
    with pytest.raises(BadRequest, match="nest deeper than 8 levels"):
        audit_file(chain)
    monkeypatch.setattr("posenc.service.audit.onnx_reader.MAX_DEPTH", 16)
    assert audit_file(chain).verdict  # 10 levels are within 16
    monkeypatch.setattr("posenc.service.audit.onnx_reader.MAX_NODES", 5)
    with pytest.raises(BadRequest, match="more than 5 nodes"):
        audit_file(chain)
