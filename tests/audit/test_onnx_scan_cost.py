"""The ONNX audit's cost: the graph scan is linear in the nodes, a model's entries are counted from its bytes
before protobuf builds them (a few MiB of empty entries refused at once), and the parse and scan run off the
event loop (issue 55)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from posenc.service.audit import onnx_reader
from posenc.service.errors import BadRequest
from tests.audit.conftest import readyz_while_held
from tests.conftest import running_client
from tests.growth import assert_linear, cpu_seconds

pytest.importorskip("onnx", reason="the audit extra (gguf, onnx): pip install 'posenc[audit]'")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def _model_of_graph_bytes(graph: bytes) -> bytes:
    """A ModelProto holding only its graph (field 7)."""
    return b"\x3a" + _varint(len(graph)) + graph


def _cos_graph(n: int) -> bytes:
    """N Cos nodes whose inputs nothing produces: each Cos is traced and its consumers looked up."""
    from onnx import helper

    nodes = [helper.make_node("Cos", [f"x{i}"], [f"y{i}"]) for i in range(n)]
    return bytes(helper.make_model(helper.make_graph(nodes, "cos", [], [])).SerializeToString())


def _scan(data: bytes) -> None:
    """Load and scan a model."""
    assert onnx_reader.to_found(onnx_reader.load(data=data)).inv_freq is None


def test_the_scan_is_linear_in_the_nodes() -> None:
    """4,000 unproduced Cos inputs took 12.7 s of CPU (each Cos looked at every node); now well under a
    second, and 8x the nodes costs about 8x, not 64x."""
    assert cpu_seconds(lambda: _scan(_cos_graph(4_000))) < 1.0
    assert_linear(_scan, _cos_graph(2_000), _cos_graph(16_000))


def test_counts_include_subgraphs_and_function_bodies(monkeypatch: pytest.MonkeyPatch) -> None:
    from onnx import TensorProto, helper

    branch = [helper.make_graph([helper.make_node("Identity", ["x"], [f"{name}{i}"]) for i in range(3)],
                                name, [], [helper.make_tensor_value_info(f"{name}0", TensorProto.FLOAT, None)])
              for name in ("then", "else")]
    when = helper.make_node("If", ["c"], ["y"], then_branch=branch[0], else_branch=branch[1])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    function = helper.make_function("local", "f", ["x"], ["y"], [helper.make_node("Neg", ["x"], ["y"])], opsets)
    weight = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    graph = helper.make_graph([when, helper.make_node("f", ["y"], ["z"], domain="local")], "g", [], [],
                              initializer=[weight])
    data = helper.make_model(graph, functions=[function], opset_imports=opsets).SerializeToString()
    counts = onnx_reader.count(data)
    assert (counts.nodes, counts.initializers) == (2 + 3 + 3 + 1, 1)
    monkeypatch.setattr(onnx_reader, "MAX_NODES", 8)
    with pytest.raises(BadRequest, match=r"more than 8 nodes \(counting subgraphs'"):
        onnx_reader.count(data)


def _never_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("the model was parsed: the count should have refused it first")

    monkeypatch.setattr(onnx, "load_model_from_string", refuse)


@pytest.mark.parametrize(("entry", "copies", "words"), [
    (b"\x2a\x00", 200_001, "more than 100000 initializers"),  # empty TensorProto, GraphProto field 5
    (b"\x0a\x00", 200_001, "more than 100000 nodes"),  # empty NodeProto, field 1
])
def test_empty_entry_bombs_are_refused_before_parsing(monkeypatch: pytest.MonkeyPatch, entry: bytes, copies: int,
                                                      words: str) -> None:
    """60 MiB of empty initializers took 31 s and 5.3 GB once parsed; the count refuses them from the bytes."""
    _never_parsed(monkeypatch)
    start = time.process_time()
    with pytest.raises(BadRequest, match=words):
        onnx_reader.load(data=_model_of_graph_bytes(entry * copies))
    assert time.process_time() - start < 1.0


def test_empty_entries_of_any_kind_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty value_info entries (field 13) or a node's empty inputs count as protobuf entries."""
    _never_parsed(monkeypatch)
    monkeypatch.setattr(onnx_reader, "MAX_ENTRIES", 1000)
    with pytest.raises(BadRequest, match="more than 1000 protobuf entries"):
        onnx_reader.load(data=_model_of_graph_bytes(b"\x6a\x00" * 1001))
    node = b"\x0a\x00" * 1001
    with pytest.raises(BadRequest, match="more than 1000 protobuf entries"):
        onnx_reader.load(data=_model_of_graph_bytes(b"\x0a" + _varint(len(node)) + node))


@pytest.mark.parametrize("data", [b"\x3a\x05\x0a", b"\x3a\x02\x0a\x05", b"\x0b\x00", b"\x3a\xff\xff\xff"])
def test_malformed_bytes_are_unreadable(data: bytes) -> None:
    with pytest.raises(BadRequest, match="not a readable ONNX model"):
        onnx_reader.load(data=data)


def _nested_types(levels: int) -> bytes:
    """A model whose graph input has a sequence type of a sequence type ... `levels` deep (TypeProto.sequence_type,
    field 4, holding TypeProto.Sequence.elem_type, field 1): the deepest message at depth 2 * levels + 2."""
    inner = b""
    for _ in range(levels):
        element = b"\x0a" + _varint(len(inner)) + inner
        inner = b"\x22" + _varint(len(element)) + element
    value = b"\x12" + _varint(len(inner)) + inner  # ValueInfoProto.type
    return _model_of_graph_bytes(b"\x5a" + _varint(len(value)) + value)  # GraphProto.input


@pytest.mark.parametrize("levels", [50, 2_000], ids=["just-past", "far-past"])
def test_messages_nested_past_the_bound_are_a_400_naming_it(monkeypatch: pytest.MonkeyPatch, levels: int) -> None:
    """Past MAX_MESSAGE_DEPTH (102 and 4,002 deep) the count refuses the bytes, naming the bound, before protobuf
    parses them (and before the count's own recursion could run out of stack)."""
    _never_parsed(monkeypatch)
    with running_client() as client:
        response = client.post("/v1/audit", content=_nested_types(levels))
    assert response.status_code == 400, response.text
    assert response.json()["error"] == ("ONNX: the file is not a readable ONNX model (messages nested deeper than "
                                        f"{onnx_reader.MAX_MESSAGE_DEPTH})")


def test_the_route_refuses_the_bomb_with_the_limit_named() -> None:
    with running_client() as client:
        response = client.post("/v1/audit", content=_model_of_graph_bytes(b"\x2a\x00" * 200_001))
    assert response.status_code == 400, response.text
    assert "more than 100000 initializers" in response.text


def test_readyz_answers_while_an_onnx_audit_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ONNX parse and scan run in a worker thread: the event loop answers /readyz meanwhile."""
    readyz_while_held(monkeypatch, onnx_reader, "to_found", _cos_graph(10))
