"""Deriving the CPU forms (`posenc.models.export.cpu_form`, `attention_forms`, `cpu_forms`): the shipped form files
are what the derivation makes of the shipped model.onnx; graphs GroupQueryAttention cannot express keep their
standard form only."""

from __future__ import annotations

import hashlib
import json

import onnx
import pytest
from onnx import TensorProto, helper

from posenc.models.export.attention_forms import build_form
from posenc.models.export.cpu_form import cpu_form
from posenc.models.export.exporter import IR_VERSION
from tests.onnx_models import REPOSITORY, SHIPPED, geometry


@pytest.mark.parametrize("model", SHIPPED)
def test_the_shipped_cpu_forms_are_derived_from_the_shipped_model(model: str) -> None:
    config = json.loads((REPOSITORY / model / "config.json").read_text())
    for entry in config["cpu_forms"]:
        form = build_form(onnx.load(REPOSITORY / model / "model.onnx"), entry["form"], *geometry(model))
        assert form is not None
        data = form.SerializeToString()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert (REPOSITORY / model / entry["file"]).read_bytes() == data


def _attention_graph(hq: int = 4, hkv: int = 2, mask: bool = False, **attributes: object) -> onnx.ModelProto:
    q = helper.make_tensor_value_info("query", TensorProto.FLOAT, ["batch", hq, "sequence", 8])
    k = helper.make_tensor_value_info("key", TensorProto.FLOAT, ["batch", hkv, "sequence", 8])
    v = helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch", hkv, "sequence", 8])
    m = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["sequence", "sequence"])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", hq, "sequence", 8])
    node = helper.make_node("Attention", ["query", "key", "value", *(["mask"] if mask else [])], ["output"],
                            **attributes)
    graph = helper.make_graph([node], "g", [q, k, v, *([m] if mask else [])], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = IR_VERSION
    return model


@pytest.mark.parametrize(("graph", "heads"), [
    (_attention_graph(is_causal=0), (4, 2)),  # bidirectional: GroupQueryAttention is always causal
    (_attention_graph(is_causal=1, softcap=30.0), (4, 2)),
    (_attention_graph(is_causal=1, qk_matmul_output_mode=1), (4, 2)),
    (_attention_graph(mask=True, is_causal=1), (4, 2)),
    (_attention_graph(hq=3, hkv=2, is_causal=1), (3, 2)),  # query heads not a multiple of the key/value heads
], ids=["bidirectional", "softcap", "output mode", "mask", "heads"])
def test_what_group_query_attention_cannot_express_has_no_cpu_form(graph: onnx.ModelProto,
                                                                   heads: tuple[int, int]) -> None:
    assert cpu_form(graph, *heads, 8) is None


def test_a_causal_attention_with_default_attributes_has_one() -> None:
    form = cpu_form(_attention_graph(is_causal=1, scale=0.5, softcap=0.0), 4, 2, 8)
    assert form is not None
    assert [n.op_type for n in form.graph.node].count("GroupQueryAttention") == 1
    assert "Attention" not in [n.op_type for n in form.graph.node]
