"""Caches where converters put them (issue 56): onnxruntime-genai's longrope pair as `Constant` nodes in the two
branches of an `If` on the sequence length, a cache in a top-level `Constant` node; and a real divergence named
(onnxruntime-genai's yarn ramp without transformers' floor/ceil of the correction range)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from posenc.models.audit.reference import from_preset
from posenc.models.rope import rope_cos_sin
from posenc.models.rope_params import RopeParameters
from posenc.service.cli.main import main
from tests.audit.conftest import audit_file, mistakes

PHI = "phi-3.5-mini-instruct"
QWEN_YARN = "qwen2.5-7b-instruct-yarn"


def _caches(params: RopeParameters, rows: int, dtype: Any = np.float16) -> tuple[np.ndarray, np.ndarray]:
    """posenc's golden cos/sin [rows, rotary_dim/2] (the table of `rows` positions: longrope's short factors up
    to original_max_position_embeddings rows, the long ones beyond), cast once."""
    cos, sin, _ = rope_cos_sin(params, rows, form="half", dtype=np.float64)
    return cos.astype(dtype), sin.astype(dtype)


def _phi_pair() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    params = from_preset(PHI).params
    assert params is not None and params.original_max_position_embeddings == 4096
    return _caches(params, 131072), _caches(params, 4096)  # the builder's large and small caches


def _branch(name: str, cos: np.ndarray, sin: np.ndarray) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Constant", [], [f"{name}/cos"], name=f"/{name}/cos_cache/Constant",
                              value=numpy_helper.from_array(cos)),
             helper.make_node("Constant", [], [f"{name}/sin"], name=f"/{name}/sin_cache/Constant",
                              value=numpy_helper.from_array(sin))]
    outputs = [helper.make_tensor_value_info(f"{name}/{k}", TensorProto.FLOAT16, list(v.shape))
               for k, v in (("cos", cos), ("sin", sin))]
    return helper.make_graph(nodes, f"{name}_rotemb_caches_graph", [], outputs)


def _if_onnx(then: tuple[np.ndarray, np.ndarray], otherwise: tuple[np.ndarray, np.ndarray],
             threshold: int = 4096, compare: str = "Greater", constant_first: bool = False) -> bytes:
    """The builder's longrope subgraph: attention_mask → Shape → Gather(1) → Greater(·, original length) → If,
    whose then branch (sequence longer than the threshold) outputs the large caches as Constant nodes and whose
    else branch the small ones, feeding com.microsoft's RotaryEmbedding (`compare`, `constant_first`: another
    comparison)."""
    from onnx import TensorProto, helper, numpy_helper

    base = "/model/rotemb_caches_subgraph"
    inits = [numpy_helper.from_array(np.array(1, dtype=np.int64), "/model/constants/INT64/0D/1"),
             numpy_helper.from_array(np.array(threshold, dtype=np.int64), f"/model/constants/INT64/0D/{threshold}")]
    nodes = [
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"], name="/model/attn_mask/Shape"),
        helper.make_node("Gather", ["mask_shape", "/model/constants/INT64/0D/1"], ["seq_len"], axis=0,
                         name="/model/attn_mask/Gather"),
        helper.make_node(compare, ["seq_len", f"/model/constants/INT64/0D/{threshold}"][:: -1 if constant_first else 1],
                         [f"{base}/Greater/output_0"], name=f"{base}/Greater"),
        helper.make_node("If", [f"{base}/Greater/output_0"], ["cos_cache", "sin_cache"], name=f"{base}/If",
                         then_branch=_branch("large", *then), else_branch=_branch("small", *otherwise)),
        helper.make_node("RotaryEmbedding", ["q", "position_ids", "cos_cache", "sin_cache"], ["out"],
                         domain="com.microsoft", interleaved=0, num_heads=32, name="/model/layers.0/attn/q_rotary"),
    ]
    graph = helper.make_graph(nodes, "phi3", [helper.make_tensor_value_info("q", TensorProto.FLOAT16, None),
                                              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, None),
                                              helper.make_tensor_value_info("position_ids", TensorProto.INT64, None)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT16, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    return path


def test_longrope_caches_in_if_branches_are_both_audited(tmp_path: Path) -> None:
    # before: the caches were not found (rotary_dim missing, the tables wrong from position 0)
    large, small = _phi_pair()
    path = _write(tmp_path, _if_onnx(large, small))
    result = audit_file(path, preset=PHI)
    facts = {f.name: f for f in result.facts}
    assert result.verdict == "correct", result.document()["facts"]
    assert facts["rotary_dim"].verdict == "ok"
    assert facts["cache_values"].verdict == "ok" and facts["cache_values.short"].verdict == "ok"
    assert facts["cache_rows.short"].found == 4096
    assert facts["cache_branch_threshold"].verdict == "ok" and facts["cache_branch_threshold"].found == 4096
    assert main(["audit", str(path), "--preset", PHI]) == 0


def test_longrope_if_branches_swapped_are_named(tmp_path: Path) -> None:
    large, small = _phi_pair()
    result = audit_file(_write(tmp_path, _if_onnx(small, large)), preset=PHI)
    assert result.verdict == "wrong" and "longrope_short_long_swapped" in mistakes(result), \
        result.document()["facts"]


def test_an_if_threshold_other_than_the_original_length_is_wrong(tmp_path: Path) -> None:
    large, small = _phi_pair()
    result = audit_file(_write(tmp_path, _if_onnx(large, small, threshold=8192)), preset=PHI)
    facts = {f.name: f for f in result.facts}
    assert result.verdict == "wrong" and facts["cache_branch_threshold"].found == 8192
    assert "scaling_original_length_wrong" in mistakes(result), result.document()["facts"]


@pytest.mark.parametrize(("compare", "constant_first", "threshold", "then_long"), [
    ("Less", True, 4096, True),  # 4096 < length
    ("GreaterOrEqual", False, 4097, True),  # length >= 4097
    ("LessOrEqual", False, 4096, False),  # length <= 4096: then is the short branch
    ("Greater", True, 4097, False),  # 4097 > length
])
def test_the_condition_is_read_whichever_comparison(tmp_path: Path, compare: str, constant_first: bool,
                                                     threshold: int, then_long: bool) -> None:
    large, small = _phi_pair()
    then, otherwise = (large, small) if then_long else (small, large)
    data = _if_onnx(then, otherwise, threshold, compare, constant_first)
    result = audit_file(_write(tmp_path, data), preset=PHI)
    facts = {f.name: f for f in result.facts}
    assert result.verdict == "correct", result.document()["facts"]
    assert facts["cache_branch_threshold"].found == 4096


def test_caches_in_a_loop_body_initializer_are_found(tmp_path: Path) -> None:
    """Layers in a Loop: the RotaryEmbedding and its caches (the body's initializers) inside the body."""
    from onnx import TensorProto, helper, numpy_helper

    large, _ = _phi_pair()
    inits = [numpy_helper.from_array(large[0], "cos_cache"), numpy_helper.from_array(large[1], "sin_cache")]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("RotaryEmbedding", ["h_in", "position_ids", "cos_cache", "sin_cache"], ["h_out"],
                          domain="com.microsoft", num_heads=32)],
        "layer", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                  helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                  helper.make_tensor_value_info("h_in", TensorProto.FLOAT16, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT16, None)], inits)
    loop = helper.make_node("Loop", ["layers", "", "q"], ["out"], body=body)
    graph = helper.make_graph([loop], "layers", [helper.make_tensor_value_info("q", TensorProto.FLOAT16, None),
                                                 helper.make_tensor_value_info("layers", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT16, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    result = audit_file(_write(tmp_path, model.SerializeToString()), preset=PHI)
    assert result.verdict == "correct", result.document()["facts"]


def test_a_cache_in_a_top_level_constant_node_is_found(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    large, _ = _phi_pair()
    nodes = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))
             for name, value in (("cos_cache", large[0]), ("sin_cache", large[1]))]
    nodes.append(helper.make_node("RotaryEmbedding", ["q", "position_ids", "cos_cache", "sin_cache"], ["out"],
                                  domain="com.microsoft", num_heads=32))
    graph = helper.make_graph(nodes, "constants", [helper.make_tensor_value_info("q", TensorProto.FLOAT16, None)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT16, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    result = audit_file(_write(tmp_path, model.SerializeToString()), preset=PHI)
    assert result.found.caches is not None and result.found.caches.cos.shape == (131072, 48)
    assert result.verdict == "correct", result.document()["facts"]


def test_yarn_caches_without_truncate_are_named(tmp_path: Path) -> None:
    from tests.audit_files import genai_onnx

    params = from_preset(QWEN_YARN).params
    assert params is not None and params.truncate
    cos, sin = _caches(dataclasses.replace(params, truncate=False), 32768)
    result = audit_file(_write(tmp_path, genai_onnx(cos, sin, heads=28, kv_heads=4)), preset=QWEN_YARN)
    assert result.divergence is not None and result.divergence.max_abs > 1.0  # onnxruntime-genai's 2.28
    assert result.verdict == "wrong" and "yarn_without_truncate" in mistakes(result), result.document()["facts"]
    fact = next(f for f in result.facts if f.mistake == "yarn_without_truncate")
    assert "truncate" in fact.explanation


def test_yarn_caches_with_truncate_pass(tmp_path: Path) -> None:
    from tests.audit_files import genai_onnx

    params = from_preset(QWEN_YARN).params
    assert params is not None
    cos, sin = _caches(params, 32768)
    result = audit_file(_write(tmp_path, genai_onnx(cos, sin, heads=28, kv_heads=4)), preset=QWEN_YARN)
    assert result.verdict == "correct", result.document()["facts"]


def test_resolving_through_nested_branches_stays_linear(monkeypatch: pytest.MonkeyPatch) -> None:
    """4,000 rotary nodes whose caches are Identity of one If's outputs, nested 6 deep, each branch ending in no
    constant: each branch is traced once (memoized by scope and name), not once per rotary node. Counted in traces,
    not timed: 8,000 cache names and 2 names in each of the 126 branches (8,252 traces), where tracing every branch
    for every cache name took 8,000 x 127 (1,016,000)."""
    from onnx import TensorProto, helper

    from posenc.service.audit import onnx_reader

    def nested(level: int, prefix: str) -> Any:
        outputs = [helper.make_tensor_value_info(f"{prefix}{k}", TensorProto.FLOAT16, None) for k in "cs"]
        if level == 0:
            nodes = [helper.make_node("Neg", ["x"], [f"{prefix}{k}"]) for k in "cs"]
        else:
            nodes = [helper.make_node("If", ["cond"], [f"{prefix}c", f"{prefix}s"],
                                      then_branch=nested(level - 1, f"{prefix}t"),
                                      else_branch=nested(level - 1, f"{prefix}e"))]
        return helper.make_graph(nodes, prefix, [], outputs)

    top = helper.make_node("If", ["cond"], ["cos", "sin"], then_branch=nested(5, "t"), else_branch=nested(5, "e"))
    nodes = [top]
    rotary = 4000
    for i in range(rotary):
        nodes += [helper.make_node("Identity", ["cos"], [f"cos{i}"]),
                  helper.make_node("Identity", ["sin"], [f"sin{i}"]),
                  helper.make_node("RotaryEmbedding", ["q", "p", f"cos{i}", f"sin{i}"], [f"out{i}"],
                                   domain="com.microsoft")]
    model = helper.make_model(helper.make_graph(nodes, "g", [], []))
    loaded = onnx_reader.load(data=model.SerializeToString())
    traces: list[tuple[Any, str]] = []
    trace = onnx_reader._Graph._trace

    def counted(graph: Any, name: str, scope: Any, depth: int) -> Any:
        traces.append((scope, name))
        return trace(graph, name, scope, depth)

    monkeypatch.setattr(onnx_reader._Graph, "_trace", counted)
    found = onnx_reader.to_found(loaded)
    assert found.caches is None
    branches = 2 ** 7 - 2  # two at each of 6 levels of If
    assert len(set(traces)) == len(traces) <= 2 * rotary + 2 * branches, (len(traces), len(set(traces)))
    assert sum(scope is not None for scope, _ in traces) == 2 * branches  # and every branch was reached


def test_yarn_caches_rounded_where_the_model_does_not_are_named() -> None:
    from posenc.models.audit.divergence import compare_caches
    from posenc.models.audit.explain_caches import explain_caches
    from posenc.models.audit.found import Caches
    from posenc.models.audit.frequencies import golden

    params = from_preset(QWEN_YARN).params
    assert params is not None
    model = dataclasses.replace(params, truncate=False)  # a model whose config says truncate: false
    cos, sin = _caches(params, 8192)
    gold = golden(model, 8192)
    divergence = compare_caches((gold.inv_freq, gold.attention_factor), cos, sin, 8192)
    facts = explain_caches(model, Caches(cos, sin), divergence)
    assert {f.mistake for f in facts if f.failing} == {"yarn_with_truncate"}, facts


def test_longrope_caches_of_another_base_name_the_base(tmp_path: Path) -> None:
    """onnxruntime-genai's longrope pair built from a config.json whose rope_theta is not the model's (the converter
    matrix's Phi-4-mini). Before: both branches `cache_values_differ` ("the caches match no known mistake"): the
    base was estimated from the first two columns as if unscaled, which longrope divides by its factors, and the long
    caches were diagnosed with the short factors (the table of their first 4096 rows, not of their length)."""
    params = from_preset(PHI).params
    assert params is not None
    other = dataclasses.replace(params, rope_theta=250000.0)
    result = audit_file(_write(tmp_path, _if_onnx(_caches(other, 131072), _caches(other, 4096))), preset=PHI)
    facts = {f.name: f for f in result.facts}
    assert mistakes(result) == {"theta"}, result.document()["facts"]
    for name in ("cache_values", "cache_values.short"):
        assert facts[name].mistake == "theta" and "the base (rope_theta) is 250000" in facts[name].explanation, \
            facts[name]
