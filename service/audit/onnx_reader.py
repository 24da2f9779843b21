"""ONNX graphs: every RotaryEmbedding node (com.microsoft's and opset 23's) with its cos_cache / sin_cache
initializers and attributes, GroupQueryAttention's do_rotary caches, and inverse-frequency constants feeding a
Cos/Sin subgraph (with a scalar Mul after them: the attention factor). Only those initializers are read; a local
file's external data is read for them alone. Walks are bounded: subgraphs and local functions nest at most
`MAX_DEPTH` deep (a function that calls itself is refused), at most `MAX_NODES` nodes are visited.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from posenc.models.audit.found import Caches, Found
from posenc.service.errors import BadRequest

MAX_DEPTH = 8
MAX_NODES = 1 << 20
TRACE_STEPS = 64  # producers walked back from a Cos input to its constants


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise BadRequest("reading ONNX files needs the onnx package: pip install 'posenc[audit]'") from exc
    return onnx


def load(data: bytes | None = None, path: Path | None = None) -> Any:
    """The ModelProto, without external data (a file's is read later for the few tensors that matter)."""
    onnx = _onnx()
    try:
        if path is not None:
            return onnx.load(str(path), load_external_data=False)
        return onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError, RecursionError, ...: the bytes are not a model
        raise BadRequest(f"ONNX: the file is not a readable ONNX model ({type(exc).__name__})") from None


def _nodes(graph: Any, functions: dict[tuple[str, str], Any], depth: int = 0, seen: list[int] | None = None
           ) -> Iterator[Any]:
    """Every node of the graph, its subgraphs and the local functions it calls, bounded."""
    seen = seen if seen is not None else [0]
    if depth > MAX_DEPTH:
        raise BadRequest(f"ONNX: subgraphs or functions nest deeper than {MAX_DEPTH} levels (a recursive function?)")
    for node in graph.node if hasattr(graph, "node") else graph:
        seen[0] += 1
        if seen[0] > MAX_NODES:
            raise BadRequest(f"ONNX: more than {MAX_NODES} nodes (counting each function call's body)")
        yield node
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                yield from _nodes(sub, functions, depth + 1, seen)
        function = functions.get((node.domain, node.op_type))
        if function is not None:
            yield from _nodes(function.node, functions, depth + 1, seen)


def _attribute(node: Any, name: str, default: Any = None) -> Any:
    onnx = _onnx()
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


class _Graph:
    def __init__(self, model: Any, base: Path | None) -> None:
        self.model, self.base = model, base
        functions = {(f.domain, f.name): f for f in model.functions}
        self.nodes = list(_nodes(model.graph, functions))
        self.initializers = {t.name: t for t in model.graph.initializer}
        self.producer = {out: node for node in self.nodes for out in node.output}
        for node in self.nodes:
            if node.op_type == "Constant" and node.output:
                value = _attribute(node, "value")
                if value is not None:
                    self.initializers.setdefault(node.output[0], value)

    def array(self, name: str) -> np.ndarray | None:
        tensor = self.initializers.get(name)
        if tensor is None:
            return None
        onnx = _onnx()
        if not onnx.external_data_helper.uses_external_data(tensor):
            return np.asarray(onnx.numpy_helper.to_array(tensor))
        if self.base is None:
            raise BadRequest(f"ONNX: initializer {name[:80]!r} is stored in an external data file; audit the "
                             "model with `posenc audit` beside its data (or send --remote the extract)")
        try:  # this tensor's bytes only, from the file its location names beside the model
            return np.asarray(onnx.numpy_helper.to_array(tensor, base_dir=str(self.base)))
        except Exception as exc:  # onnx's ValidationError, OSError: a location outside, a missing file
            raise BadRequest(f"ONNX: the external data of {name[:80]!r} cannot be read beside the model "
                             f"({type(exc).__name__})") from None

    def consumers(self, name: str) -> list[Any]:
        return [node for node in self.nodes if name in node.input]


def _constant_feeding(graph: _Graph, name: str) -> np.ndarray | None:
    """The float constant of more than one value a Cos/Sin input is computed from (inv_freq; [2, n] pairs)."""
    frontier, steps = [name], 0
    while frontier and steps < TRACE_STEPS:
        current = frontier.pop(0)
        steps += 1
        node = graph.producer.get(current)
        if node is None:
            continue
        for inp in node.input:
            tensor = graph.initializers.get(inp)
            if tensor is not None and tensor.data_type in (1, 10, 11, 16):  # float, float16, double, bfloat16
                value = graph.array(inp)
                if value is not None and value.size > 1:
                    rows = value.reshape(-1, value.shape[-1])  # [1, n] a vector, [2, n] a short/long pair
                    return rows if rows.shape[0] == 2 else rows[0]
            elif tensor is None:
                frontier.append(inp)
    return None


def _scale_after(graph: _Graph, name: str) -> float | None:
    for node in graph.consumers(name):
        if node.op_type == "Mul":
            for inp in node.input:
                value = graph.array(inp) if inp != name else None
                if value is not None and value.size == 1:
                    return float(value.reshape(-1)[0])
    return None


def _caches(cos: np.ndarray | None, sin: np.ndarray | None, interleaved: bool | None) -> Caches | None:
    """cos/sin caches [rows, n] (a leading batch of one dropped); None when they are not such a pair."""
    if cos is None or sin is None or cos.shape != sin.shape or cos.ndim < 2 or cos.size == 0:
        return None
    return Caches(cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]), interleaved)


def to_found(model: Any, base: Path | None = None) -> Found:
    graph = _Graph(model, base)
    found = Found("onnx")
    rotary = [n for n in graph.nodes if n.op_type == "RotaryEmbedding"]
    gqa = [n for n in graph.nodes if n.op_type == "GroupQueryAttention" and _attribute(n, "do_rotary", 0)]
    for node in rotary:
        contrib = node.domain == "com.microsoft"
        if len(node.input) < (4 if contrib else 3):
            continue
        cos_name, sin_name = (node.input[2], node.input[3]) if contrib else (node.input[1], node.input[2])
        found.interleaved = bool(_attribute(node, "interleaved", 0))
        dim = _attribute(node, "rotary_embedding_dim", 0)
        found.rotary_dim = dim or found.rotary_dim
        found.num_heads = _attribute(node, "num_heads", 0) or found.num_heads
        if _attribute(node, "is_packed_batching", 0):
            found.notes.append(f"{node.name or node.op_type}: is_packed_batching")
        if found.caches is None:
            found.caches = _caches(graph.array(cos_name), graph.array(sin_name), found.interleaved)
    for node in gqa:
        found.interleaved = bool(_attribute(node, "rotary_interleaved", 0))
        found.num_heads = _attribute(node, "num_heads", 0) or found.num_heads
        found.num_kv_heads = _attribute(node, "kv_num_heads", 0) or found.num_kv_heads
        if len(node.input) > 8 and found.caches is None:
            found.caches = _caches(graph.array(node.input[7]), graph.array(node.input[8]), found.interleaved)
    for node in graph.nodes:
        if node.op_type == "Cos" and found.inv_freq is None and node.input and node.output:
            found.inv_freq = _constant_feeding(graph, node.input[0])
            found.attention_factor = _scale_after(graph, node.output[0])
    if found.caches is not None:
        found.rotary_dim = found.rotary_dim or 2 * found.caches.cos.shape[1]
    elif found.inv_freq is not None:
        found.rotary_dim = found.rotary_dim or 2 * found.inv_freq.shape[-1]
    if not rotary and not gqa and found.inv_freq is None:
        found.notes.append("no RotaryEmbedding, GroupQueryAttention with do_rotary or Cos of a constant: no RoPE "
                           "in this graph")
    return found
