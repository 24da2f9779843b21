"""ONNX graphs: every RotaryEmbedding node (com.microsoft's and opset 23's) with its cos_cache / sin_cache
and attributes, GroupQueryAttention's do_rotary caches, and inverse-frequency constants feeding a Cos/Sin subgraph
(with a scalar Mul after them: the attention factor). Only those constants are read; a local file's external data
is read for them alone. Walks are bounded: subgraphs and local functions nest at most `MAX_DEPTH` deep (a function
that calls itself is refused), at most `MAX_NODES` nodes are visited.

A constant is an initializer (of the main graph or of any subgraph) or a `Constant` node's `value`, reached through
`Identity` and through the outputs of an `If` (each branch) or a `Loop` (its body's loop-carried outputs):
onnxruntime-genai's model builder puts longrope's long and short caches as `Constant` nodes in the two branches of
an `If` on `sequence length > original_max_position_embeddings`. Every branch is kept (`BranchedCaches`: the one
taken past the condition's threshold first, the threshold when the condition is a comparison with a constant).

Before protobuf builds the model, a walk over its bytes (`count`: varints, no object per entry) refuses a model of
more than `MAX_NODES` nodes (subgraphs' and local functions' included), `MAX_INITIALIZERS` initializers or
`MAX_ENTRIES` protobuf fields in its graphs, nodes, attributes, tensors and types: a few MiB of empty entries
would otherwise take gigabytes once parsed. The scan is linear: producers and consumers are indexed by tensor
name once, and each tensor is traced back towards its constants at most once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from posenc.models.audit.explain_caches import BranchedCaches
from posenc.models.audit.found import Caches, Found
from posenc.service.audit import values
from posenc.service.errors import BadRequest

MAX_DEPTH = 8
MAX_NODES = 100_000  # in the bytes (subgraphs and function bodies included), and visited (each call's body)
MAX_INITIALIZERS = 100_000
MAX_ENTRIES = 2_000_000  # protobuf fields walked by `count`
MAX_MESSAGE_DEPTH = 100  # protobuf's own recursion limit
TRACE_STEPS = 64  # producers walked back from a Cos input to its constants
# the initializer types read (TensorProto data_type): floats, integers and bool, each a whole number of bytes
READ_TYPES = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16})
TRACE_INPUTS = 256  # inputs of those producers looked at, per Cos input traced

# The messages `count` walks into: {message: {field number: message}} (onnx.proto; "leaf": fields counted only).
_CHILDREN: dict[str, dict[int, str]] = {
    "model": {7: "graph", 20: "training", 25: "function", 26: "leaf"},
    "training": {1: "graph", 2: "graph"},
    "graph": {1: "node", 5: "tensor", 11: "value", 12: "value", 13: "value", 14: "leaf", 15: "sparse"},
    "node": {5: "attribute", 10: "leaf"},
    "attribute": {5: "tensor", 6: "graph", 10: "tensor", 11: "graph", 14: "type", 15: "type", 22: "sparse",
                  23: "sparse"},
    "function": {7: "node", 11: "attribute", 12: "value"},
    "sparse": {1: "tensor", 2: "tensor"},
    "value": {2: "type"},
    "type": {1: "type_tensor", 4: "type_element", 5: "type_map", 8: "type_tensor", 9: "type_element"},
    "type_tensor": {2: "leaf"},
    "type_element": {1: "type"},
    "type_map": {2: "type"},
}
# The entries counted against a limit: {(message, field number): what}
_COUNTED = {("graph", 1): "nodes", ("function", 7): "nodes", ("graph", 5): "initializers",
            ("graph", 15): "initializers"}


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise BadRequest("reading ONNX files needs the onnx package: pip install 'posenc[audit]'") from exc
    return onnx


def _unreadable(reason: str) -> BadRequest:
    return BadRequest(f"ONNX: the file is not a readable ONNX model ({reason})")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it (IndexError past the end)."""
    byte = data[pos]
    value, shift = byte & 0x7F, 7
    while byte & 0x80:
        pos += 1
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        shift += 7
        if shift > 70:
            raise ValueError("varint")
    return value, pos + 1


@dataclass
class Counts:
    """What `count` found in a model's bytes."""

    nodes: int = 0
    initializers: int = 0
    entries: int = 0


def _too_many(what: str) -> BadRequest:
    bound, words = {"nodes": (MAX_NODES, "nodes (counting subgraphs' and local functions' nodes)"),
                    "initializers": (MAX_INITIALIZERS, "initializers"),
                    "entries": (MAX_ENTRIES, "protobuf entries (fields of its graphs, nodes, attributes, tensors "
                                             "and types)")}[what]
    return BadRequest(f"ONNX: more than {bound} {words}; the audit reads models within these bounds")


def _value(data: bytes, pos: int, wire: int) -> tuple[int, int]:
    """Where a field's value starts (a length-delimited one's payload) and where the field ends."""
    if wire == 0:
        return pos, _varint(data, pos)[1]
    if wire == 1 or wire == 5:
        return pos, pos + (8 if wire == 1 else 4)
    if wire == 2:
        length, start = _varint(data, pos)
        return start, start + length
    raise _unreadable(f"wire type {wire}")


def _tally(counts: Counts, what: str | None) -> None:
    if what == "nodes":
        counts.nodes += 1
        if counts.nodes > MAX_NODES:
            raise _too_many(what)
    elif what == "initializers":
        counts.initializers += 1
        if counts.initializers > MAX_INITIALIZERS:
            raise _too_many(what)


def _walk(data: bytes, pos: int, end: int, message: str, depth: int, counts: Counts) -> None:
    """Count the fields of one message in data[pos:end] and of the messages in it that `_CHILDREN` names."""
    if depth > MAX_MESSAGE_DEPTH:
        raise _unreadable(f"messages nested deeper than {MAX_MESSAGE_DEPTH}")
    children = _CHILDREN.get(message, {})
    while pos < end:
        key, pos = _varint(data, pos)
        counts.entries += 1
        if counts.entries > MAX_ENTRIES:
            raise _too_many("entries")
        start, pos = _value(data, pos, key & 7)
        if pos > end:
            raise _unreadable("a field runs past its message")
        child = children.get(key >> 3) if key & 7 == 2 else None
        if child is not None:
            _walk(data, start, pos, child, depth + 1, counts)
            _tally(counts, _COUNTED.get((message, key >> 3)))


def count(data: bytes) -> Counts:
    """Nodes, initializers and protobuf entries of a serialized ModelProto, from its bytes alone (no object per
    entry); a 400 past `MAX_NODES`, `MAX_INITIALIZERS` or `MAX_ENTRIES`, or on bytes that are no protobuf."""
    counts = Counts()
    try:
        _walk(data, 0, len(data), "model", 0, counts)
    except (IndexError, ValueError):
        raise _unreadable("truncated or malformed protobuf") from None
    return counts


def load(data: bytes | None = None, path: Path | None = None) -> Any:
    """The ModelProto, without external data (a file's is read later for the few tensors that matter), once
    `count` has bounded its bytes."""
    onnx = _onnx()
    try:
        if path is not None:
            data = path.read_bytes()
    except OSError as exc:
        raise BadRequest(f"cannot read {path}: {exc.strerror}") from None
    count(data or b"")
    try:
        return onnx.load_model_from_string(data)
    except Exception as exc:  # protobuf's DecodeError, RecursionError, ...: the bytes are not a model
        raise _unreadable(type(exc).__name__) from None


@dataclass
class _Walk:
    """One walk's state: the nodes visited, the subgraphs met (each stored graph once: a function's body's
    subgraphs on its first call only) and the functions called so far."""

    seen: int = 0
    graphs: list[Any] = field(default_factory=list)
    called: set[tuple[str, str]] = field(default_factory=set)


def _nodes(graph: Any, functions: dict[tuple[str, str], Any], depth: int = 0, walk: _Walk | None = None,
           collect: bool = True) -> Iterator[Any]:
    """Every node of the graph, its subgraphs and the local functions it calls, bounded; the subgraphs go to
    `walk.graphs` (for their initializers) when `collect`."""
    walk = walk if walk is not None else _Walk()
    if depth > MAX_DEPTH:
        raise BadRequest(f"ONNX: subgraphs or functions nest deeper than {MAX_DEPTH} levels (a recursive function?)")
    for node in graph.node if hasattr(graph, "node") else graph:
        walk.seen += 1
        if walk.seen > MAX_NODES:
            raise BadRequest(f"ONNX: more than {MAX_NODES} nodes (counting each function call's body)")
        yield node
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
                if collect:
                    walk.graphs.append(sub)
                yield from _nodes(sub, functions, depth + 1, walk, collect)
        key = (node.domain, node.op_type)
        function = functions.get(key)
        if function is not None:
            first = key not in walk.called
            walk.called.add(key)
            yield from _nodes(function.node, functions, depth + 1, walk, first)


def _attribute(node: Any, name: str, default: Any = None) -> Any:
    onnx = _onnx()
    for attribute in node.attribute:
        if attribute.name == name:
            return onnx.helper.get_attribute_value(attribute)
    return default


def _index(nodes: list[Any]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The node producing each tensor and the nodes consuming it (each once), by tensor name."""
    producer: dict[str, Any] = {}
    consumers: dict[str, list[Any]] = {}
    for node in nodes:
        for out in node.output:
            producer[out] = node
        for inp in set(node.input):
            consumers.setdefault(inp, []).append(node)
    return producer, consumers


Scope = tuple[dict[str, Any], dict[str, Any]]  # a subgraph's initializers and producers, by tensor name
COMPARISONS = frozenset({"Greater", "GreaterOrEqual", "Less", "LessOrEqual"})


class _Graph:
    def __init__(self, model: Any, base: Path | None) -> None:
        self.model, self.base = model, base
        functions = {(f.domain, f.name): f for f in model.functions}
        walk = _Walk()
        self.nodes = list(_nodes(model.graph, functions, walk=walk))
        self.initializers = {t.name: t for t in model.graph.initializer}
        for sub in walk.graphs:  # each stored subgraph once: linear in the initializers `count` bounded
            for tensor in sub.initializer:
                self.initializers.setdefault(tensor.name, tensor)
        self.producer, self.consumers = _index(self.nodes)
        self.traced: set[str] = set()  # tensors already traced back towards their constants
        # `constants` by (scope, name); a scope is a branch (its node's first output, the attribute), indexed once
        self.resolved: dict[tuple[tuple[str, str] | None, str], list[tuple[str, Any]]] = {}
        self.scopes: dict[tuple[str, str], Scope] = {}
        for node in self.nodes:
            if node.op_type == "Constant" and node.output:
                value = _attribute(node, "value")
                if value is not None:
                    self.initializers.setdefault(node.output[0], value)

    def size(self, name: str) -> int | None:
        """The element count of a constant tensor by its dims (nothing converted), None for no constant."""
        tensor = self.initializers.get(name)
        return None if tensor is None else prod(tensor.dims)

    def array(self, name: str) -> np.ndarray | None:
        tensor = self.initializers.get(name)
        return None if tensor is None else self.array_of(tensor, name)

    def array_of(self, tensor: Any, name: str) -> np.ndarray:
        onnx = _onnx()
        external = onnx.external_data_helper.uses_external_data(tensor)
        _check_tensor(onnx, tensor, name, external)
        if not external:
            return np.asarray(onnx.numpy_helper.to_array(tensor))
        if self.base is None:
            raise BadRequest(f"ONNX: initializer {name[:80]!r} is stored in an external data file; audit the "
                             "model with `posenc audit` beside its data (or send --remote the extract)")
        try:  # this tensor's bytes only, from the file its location names beside the model
            return np.asarray(onnx.numpy_helper.to_array(tensor, base_dir=str(self.base)))
        except Exception as exc:  # onnx's ValidationError, OSError: a location outside, a missing file
            raise BadRequest(f"ONNX: the external data of {name[:80]!r} cannot be read beside the model "
                             f"({type(exc).__name__})") from None

    def constants(self, name: str) -> list[tuple[str, Any]]:
        """The constant tensors `name` can hold, each with where ("" the graph's own; "If 'x' then_branch", ...):
        through Identity, into each branch of an If and a Loop's body (its loop-carried outputs), nested at most
        `MAX_DEPTH` deep. Memoized by scope and name, each branch indexed once: linear in the graph."""
        return self._constants(name, None, 0)

    def _constants(self, name: str, scope: tuple[str, str] | None, depth: int) -> list[tuple[str, Any]]:
        key = (scope, name)
        if key not in self.resolved:
            self.resolved[key] = []  # a cycle finds nothing
            self.resolved[key] = self._trace(name, scope, depth)
        return self.resolved[key]

    def _trace(self, name: str, scope: tuple[str, str] | None, depth: int) -> list[tuple[str, Any]]:
        initializers, producers = self.scopes[scope] if scope is not None else ({}, {})
        for _ in range(TRACE_STEPS):
            if name in initializers:
                return [("", initializers[name])]
            node = producers.get(name)
            if node is None:
                if name in self.initializers:
                    return [("", self.initializers[name])]
                node = self.producer.get(name)
            if node is None:
                return []
            if node.op_type == "Constant":
                value = _attribute(node, "value")
                return [] if value is None else [("", value)]
            if node.op_type == "Identity" and node.input:
                name = node.input[0]
                continue
            if node.op_type in ("If", "Loop") and depth < MAX_DEPTH:
                return self._branches(node, name, depth)
            return []
        return []

    def _branches(self, node: Any, name: str, depth: int) -> list[tuple[str, Any]]:
        index = list(node.output).index(name)
        if node.op_type == "Loop":
            if index >= len(node.input) - 2:  # a scan output stacks every iteration's value
                return []
            index += 1  # the body's first output is the condition
        out = []
        for attribute in node.attribute:
            if not attribute.HasField("g") or index >= len(attribute.g.output):
                continue
            scope = (node.output[0], attribute.name)
            if scope not in self.scopes:
                branch = attribute.g
                self.scopes[scope] = ({t.name: t for t in branch.initializer},
                                      {out: n for n in branch.node for out in n.output})
            label = f"{node.op_type} {(node.name or node.output[0])[:80]!r} {attribute.name}"
            out += [(f"{label} / {where}" if where else label, tensor)
                    for where, tensor in self._constants(attribute.g.output[index].name, scope, depth + 1)]
        return out


def _check_tensor(onnx: Any, tensor: Any, name: str, external: bool) -> None:
    """An initializer's type is one the audit reads, its dims a shape (`values.shape`), and, stored in the model,
    its data holds exactly the values its dims declare."""
    what = f"ONNX: initializer {name[:80]!r}"
    if tensor.data_type not in READ_TYPES:
        raise BadRequest(f"{what} has data_type {tensor.data_type}; the audit reads float, integer and bool tensors "
                         f"(data_type one of {', '.join(map(str, sorted(READ_TYPES)))})")
    elements = prod(values.shape(f"{what}: dims", list(tensor.dims)))
    if external:
        return
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    held = len(tensor.raw_data) if tensor.HasField("raw_data") else \
        len(getattr(tensor, onnx.helper.tensor_dtype_to_field(tensor.data_type))) * itemsize
    if held != elements * itemsize:
        raise BadRequest(f"{what}: its data holds {held // itemsize} values ({held} bytes), its dims "
                         f"{list(tensor.dims)} declare {elements}")


def _float_constant(graph: _Graph, name: str) -> np.ndarray | None:
    """A float constant of more than one value as inv_freq: a vector, or the rows of a [2, n] short/long pair."""
    tensor = graph.initializers.get(name)
    if tensor is None or tensor.data_type not in (1, 10, 11, 16):  # float, float16, double, bfloat16
        return None
    value = graph.array(name)
    if value is None or value.size <= 1:
        return None
    rows = value.reshape(-1, value.shape[-1])  # [1, n] a vector, [2, n] a short/long pair
    return rows if rows.shape[0] == 2 else rows[0]


def _constant_feeding(graph: _Graph, name: str) -> np.ndarray | None:
    """The float constant of more than one value a Cos/Sin input is computed from (inv_freq; [2, n] pairs).
    Each tensor is traced back once per graph (`graph.traced`): a later Cos reaching it finds nothing new there,
    so the traces of all Cos nodes together are linear in the graph."""
    frontier, steps, looked = deque([name]), 0, 0
    while frontier and steps < TRACE_STEPS and looked < TRACE_INPUTS:
        current = frontier.popleft()
        node = graph.producer.get(current)
        if node is None or current in graph.traced:
            continue
        graph.traced.add(current)
        steps += 1
        for inp in node.input[:TRACE_INPUTS - looked]:
            looked += 1
            value = _float_constant(graph, inp)
            if value is not None:
                return value
            if inp not in graph.initializers:
                frontier.append(inp)
    return None


def _scale_after(graph: _Graph, name: str) -> float | None:
    for node in graph.consumers.get(name, []):
        if node.op_type == "Mul":
            for inp in node.input:
                value = graph.array(inp) if inp != name and graph.size(inp) == 1 else None
                if value is not None and value.size == 1:
                    return float(value.reshape(-1)[0])
    return None


def _caches(cos: np.ndarray | None, sin: np.ndarray | None, interleaved: bool | None) -> Caches | None:
    """cos/sin caches [rows, n] (a leading batch of one dropped); None when they are not such a pair."""
    if cos is None or sin is None or cos.shape != sin.shape or cos.ndim < 2 or cos.size == 0:
        return None
    return Caches(cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]), interleaved)


def _scalar(graph: _Graph, name: str) -> float | None:
    """The value of a one-element numeric constant `name` holds (through Identity), None otherwise."""
    found = graph.constants(name)
    if len(found) != 1 or found[0][0] or prod(found[0][1].dims) != 1 or found[0][1].data_type not in READ_TYPES:
        return None
    value = graph.array_of(found[0][1], name).reshape(-1)
    return float(value[0]) if value.dtype.kind in "iuf" and np.isfinite(value[0]) else None


def _switch(graph: _Graph, node: Any) -> tuple[bool | None, int | float | None]:
    """An If's condition read as `length > threshold`: (whether its then branch is the one taken past the
    threshold, the threshold); (None, None) when the condition is no comparison of a value with a constant.
    onnxruntime-genai: Greater(sequence length, original_max_position_embeddings), the large caches in then."""
    cond = graph.producer.get(node.input[0]) if node.input else None
    if cond is None or cond.op_type not in COMPARISONS or len(cond.input) != 2:
        return None, None
    for side, name in enumerate(cond.input):
        value = _scalar(graph, name)
        if value is None or _scalar(graph, cond.input[1 - side]) is not None:
            continue
        then_long = (side == 1) == cond.op_type.startswith("Greater")
        strict = cond.op_type in ("Greater", "Less")
        threshold = value if strict == then_long else value - 1  # long when length > threshold
        return then_long, int(threshold) if float(threshold).is_integer() else threshold
    return None, None


def _cache_pair(graph: _Graph, cos_name: str, sin_name: str, interleaved: bool | None, notes: list[str]
                ) -> Caches | None:
    """The caches two inputs hold: one pair of constants, or one per branch of the If (or Loop) computing them
    (`BranchedCaches`, the branch taken past the condition's threshold first)."""
    sines = dict(graph.constants(sin_name))
    pairs = []
    for where, cos in graph.constants(cos_name):
        sin = sines.get(where)
        caches = None if sin is None else _caches(graph.array_of(cos, cos_name), graph.array_of(sin, sin_name),
                                                  interleaved)
        if caches is not None:
            pairs.append((where, caches))
    if not pairs:
        return None
    if len(pairs) == 1 and not pairs[0][0]:
        return pairs[0][1]
    node = graph.producer.get(cos_name)
    while node is not None and node.op_type == "Identity" and node.input:
        node = graph.producer.get(node.input[0])
    then_long, threshold = _switch(graph, node) if node is not None and node.op_type == "If" else (None, None)
    # the branch taken past the threshold first (then, as onnxruntime-genai writes it, when not read)
    pairs.sort(key=lambda pair: (" then_branch" in pair[0].split(" / ")[0]) == (then_long is False))
    where, first = pairs[0]
    notes.append(f"{cos_name[:80]}/{sin_name[:80]}: one pair per branch ("
                 + "; ".join(f"{w}: {list(c.cos.shape)}" for w, c in pairs) + ")"
                 + (f", the first taken when the sequence length > {threshold}" if threshold is not None
                    else ", which branch is taken when was not read from the graph"))
    return BranchedCaches(first.cos, first.sin, interleaved, where=where, branches=tuple(pairs[1:]),
                          threshold=threshold)


def to_found(model: Any, base: Path | None = None) -> Found:
    graph = _Graph(model, base)
    found = Found("onnx")
    # onnxruntime-genai writes Qwen2.5-VL's and Qwen3-VL's M-RoPE as com.microsoft's MRotaryEmbedding: the same inputs
    # (x, position_ids, cos_cache, sin_cache) with the sections as an attribute
    rotary = [n for n in graph.nodes if n.op_type in ("RotaryEmbedding", "MRotaryEmbedding")]
    gqa = [n for n in graph.nodes if n.op_type == "GroupQueryAttention" and _attribute(n, "do_rotary", 0)]
    for node in rotary:
        contrib = node.domain == "com.microsoft"
        if len(node.input) < (4 if contrib else 3):
            continue
        cos_name, sin_name = (node.input[2], node.input[3]) if contrib else (node.input[1], node.input[2])
        found.interleaved = bool(_attribute(node, "interleaved", 0))
        dim = _attribute(node, "rotary_embedding_dim", 0)
        found.rotary_dim = dim or found.rotary_dim
        # q's node and k's (MRotaryEmbedding applies to each apart): the query heads are the larger count
        found.num_heads = max(_attribute(node, "num_heads", 0), found.num_heads or 0) or None
        sections = _attribute(node, "mrope_section", None) if node.op_type == "MRotaryEmbedding" else None
        if sections is not None and found.sections is None:
            found.sections = values.integers(f"ONNX: {node.op_type}.mrope_section", list(sections)[:8])
            found.notes.append(f"{node.name or node.op_type}: M-RoPE sections {list(found.sections)}, mrope_layout "
                               f"{_attribute(node, 'mrope_layout', 0)}")
        if _attribute(node, "is_packed_batching", 0):
            found.notes.append(f"{node.name or node.op_type}: is_packed_batching")
        if found.caches is None:
            found.caches = _cache_pair(graph, cos_name, sin_name, found.interleaved, found.notes)
    for node in gqa:
        found.interleaved = bool(_attribute(node, "rotary_interleaved", 0))
        found.num_heads = _attribute(node, "num_heads", 0) or found.num_heads
        found.num_kv_heads = _attribute(node, "kv_num_heads", 0) or found.num_kv_heads
        if len(node.input) > 8 and found.caches is None:
            found.caches = _cache_pair(graph, node.input[7], node.input[8], found.interleaved, found.notes)
    for node in graph.nodes:
        if node.op_type == "Cos" and found.inv_freq is None and node.input and node.output:
            found.inv_freq = _constant_feeding(graph, node.input[0])
            found.attention_factor = _scale_after(graph, node.output[0])
    if found.caches is not None:
        found.rotary_dim = found.rotary_dim or 2 * found.caches.cos.shape[1]
    elif found.inv_freq is not None:
        found.rotary_dim = found.rotary_dim or 2 * found.inv_freq.shape[-1]
    if not rotary and not gqa and found.inv_freq is None:
        found.notes.append("no (M)RotaryEmbedding, GroupQueryAttention with do_rotary or Cos of a constant: no RoPE "
                           "in this graph")
    return found
