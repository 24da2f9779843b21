"""Other graphs for the attention of an exported model, to measure against `model.onnx` on a given CPU.

Each form replaces the one causal opset-23 `Attention` node of `model.onnx` (query [B, Hq, S, D] and key and
value [B, Hkv, S, D] after the rotary nodes, no mask or cache) and keeps everything before it:

* `unfused`: MatMul(Q · scale, Kᵀ) + causal mask, Softmax, MatMul(·, V): MLAS's batched GEMMs. With Hkv < Hq the
  query heads of each key/value head are stacked as the rows of one GEMM ([B, Hkv, G·S, D]; no copy of K or V):
  on a 2-core Xeon this ran llama3_1_attention's blocked forms 3–16 % faster than broadcasting K and V over
  the group (docs/performance.md).
  The mask is built in the graph from S ([S, S], 0 on and below the diagonal, -inf above).
* `blocked<N>` (N >= 2): the same in N query blocks, block i attending keys 0 .. its last row only, so the fully masked
  upper-right blocks are never computed (about (N + 1) / 2N of the scores), outputs concatenated.
* `mha`: com.microsoft MultiHeadAttention with `unidirectional=1` (query [B, S, Hq·D], key and value [B, Hq, S, D];
  key/value heads repeated to Hq when Hkv < Hq).
* `gqa`: com.microsoft GroupQueryAttention (the shipped CPU form, `posenc.models.export.cpu_form`).

`build_form(model, name, num_heads, num_kv_heads, head_dim)` returns the form's ModelProto, or None where the
graph has no such node. The measurement (onnxruntime per form and session option, torch eager, parity) is
`python -m bench forms` (bench/forms.py).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import onnx
from onnx import TensorProto, helper

from posenc.models.export.cpu_form import CONTRIB_DOMAIN, cpu_form

PREFIX = "form_"
FORMS = ("unfused", "blocked4", "blocked8", "blocked16", "blocked32", "mha", "gqa")  # blocked<N>: any N >= 2


def _attention(model: onnx.ModelProto) -> tuple[int, onnx.NodeProto, float | None] | None:
    found = [at for at, node in enumerate(model.graph.node)
             if node.op_type == "Attention" and node.domain in ("", "ai.onnx")]
    if len(found) != 1:
        return None
    node = model.graph.node[found[0]]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if len([i for i in node.input if i]) != 3 or attrs.get("is_causal") != 1 or attrs.get("softcap", 0.0) != 0.0:
        return None
    return found[0], node, attrs.get("scale")


class _Graph:
    """Nodes and initializers of a replacement, with unique names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{PREFIX}{hint}_{self.count}"

    def const(self, hint: str, dtype: int, dims: list[int], values: list[float] | list[int]) -> str:
        name = self.name(hint)
        self.constants.append(helper.make_tensor(name, dtype, dims, values))
        return name

    def ints(self, hint: str, values: list[int]) -> str:
        return self.const(hint, TensorProto.INT64, [len(values)], values)

    def op(self, op_type: str, inputs: list[str], output: str | None = None, **attrs: Any) -> str:
        out = output or self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out


def _seq_len(g: _Graph, query: str) -> str:
    """S as a 1-element int64 tensor."""
    shape = g.op("Shape", [query])
    return g.op("Slice", [shape, g.ints("two", [2]), g.ints("three", [3])])


def _causal_mask(g: _Graph, seq: str) -> str:
    """[S, S] float32: 0 where key <= query, -inf above the diagonal."""
    scalar = g.op("Squeeze", [seq, g.ints("axis0", [0])])
    positions = g.op("Range", [g.const("zero", TensorProto.INT64, [], [0]), scalar,
                               g.const("one", TensorProto.INT64, [], [1])])
    rows = g.op("Unsqueeze", [positions, g.ints("axis1", [1])])
    cols = g.op("Unsqueeze", [positions, g.ints("axis0", [0])])
    keep = g.op("GreaterOrEqual", [rows, cols])
    return g.op("Where", [keep, g.const("zero_f", TensorProto.FLOAT, [], [0.0]),
                          g.const("minus_inf", TensorProto.FLOAT, [], [float("-inf")])])


def _unfused(g: _Graph, query: str, key: str, value: str, output: str, heads: tuple[int, int, int], scale: float,
             blocks: int) -> None:
    num_heads, num_kv_heads, head_dim = heads
    group = num_heads // num_kv_heads
    seq = _seq_len(g, query)
    mask = _causal_mask(g, seq)
    kt = g.op("Transpose", [key], perm=[0, 1, 3, 2])  # [B, Hkv, D, S]
    q = g.op("Mul", [query, g.const("scale", TensorProto.FLOAT, [], [scale])])
    if group > 1:  # [B, Hkv, G, S, D]: each key/value head's query heads together
        q = g.op("Reshape", [q, g.ints("q5", [0, num_kv_heads, group, -1, head_dim])])
    seq_axis = 3 if group > 1 else 2
    if blocks <= 1:
        out = _block(g, q, kt, value, mask, heads)
    else:
        # block length c = ceil(S / N); block i: query rows [i·c, (i+1)·c), keys [0, (i+1)·c)
        c = g.op("Div", [g.op("Add", [seq, g.ints("blocks_minus_1", [blocks - 1])]), g.ints("blocks", [blocks])])
        zero, q_axis = g.ints("zero1", [0]), g.ints("q_axis", [seq_axis])
        key_axis, value_axis = g.ints("key_axis", [3]), g.ints("value_axis", [2])
        mask_rows, mask_cols = g.ints("mask_rows", [0]), g.ints("mask_cols", [1])
        parts = []
        for i in range(blocks):
            start = g.op("Mul", [c, g.ints("i", [i])])
            end = g.op("Mul", [c, g.ints("i1", [i + 1])])
            qi = g.op("Slice", [q, start, end, q_axis])
            kti = g.op("Slice", [kt, zero, end, key_axis])
            vi = g.op("Slice", [value, zero, end, value_axis])
            mi = g.op("Slice", [g.op("Slice", [mask, start, end, mask_rows]), zero, end, mask_cols])
            parts.append(_block(g, qi, kti, vi, mi, heads))
        out = g.op("Concat", parts, axis=seq_axis)
    if group > 1:
        g.op("Reshape", [out, g.ints("heads", [0, num_heads, -1, head_dim])], output)
    else:
        g.op("Identity", [out], output)


def _block(g: _Graph, q: str, kt: str, v: str, mask: str, heads: tuple[int, int, int]) -> str:
    """softmax(q · kt + mask) · v for q [B, H, c, D] (or, grouped, [B, Hkv, G, c, D]), kt [B, Hkv, D, k],
    v [B, Hkv, k, D], mask [c, k]. Grouped query heads are multiplied as [B, Hkv, G·c, D]: one GEMM per key/value
    head with G times the rows (MLAS packs each key block once for all of them), not G broadcast ones."""
    num_heads, num_kv_heads, _ = heads
    if num_heads == num_kv_heads:
        scores = g.op("Add", [g.op("MatMul", [q, kt]), mask])
        return g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    shape = g.op("Shape", [q])  # [B, Hkv, G, c, D]; a block may be empty (S < N): no -1, and a 0 is a 0 (allowzero)
    part = {name: g.op("Slice", [shape, g.ints("from", [at]), g.ints("to", [at + length])])
            for name, at, length in (("heads", 0, 2), ("group", 2, 1), ("rows", 3, 1), ("dim", 4, 1))}
    stacked = g.op("Concat", [part["heads"], g.op("Mul", [part["group"], part["rows"]]), part["dim"]], axis=0)
    rows = g.op("Reshape", [q, stacked], allowzero=1)
    scores = g.op("MatMul", [rows, kt])  # [B, Hkv, G·c, k]
    by_head = g.op("Concat", [g.op("Shape", [q], end=-1), g.op("Shape", [kt], start=-1)], axis=0)  # [B, Hkv, G, c, k]
    by_head_scores = g.op("Reshape", [scores, by_head], allowzero=1)
    probs = g.op("Softmax", [g.op("Add", [by_head_scores, mask])], axis=-1)  # [B, Hkv, G, c, k]
    out = g.op("MatMul", [g.op("Reshape", [probs, g.op("Shape", [scores])], allowzero=1), v])  # [B, Hkv, G·c, D]
    return g.op("Reshape", [out, shape], allowzero=1)


def _mha(g: _Graph, query: str, key: str, value: str, output: str, heads: tuple[int, int, int], scale: float) -> None:
    num_heads, num_kv_heads, head_dim = heads
    if num_kv_heads != num_heads:  # MultiHeadAttention has no grouped heads: repeat each key/value head
        group = num_heads // num_kv_heads
        axis2 = g.ints("axis2", [2])
        full = g.ints("full", [1, 1, group, 1, 1])
        flat = g.ints("kv_heads", [0, num_heads, -1, head_dim])
        key = g.op("Reshape", [g.op("Expand", [g.op("Unsqueeze", [key, axis2]), full]), flat])
        value = g.op("Reshape", [g.op("Expand", [g.op("Unsqueeze", [value, axis2]), full]), flat])
    bsnh = [0, 2, 1, 3]
    q3 = g.op("Reshape", [g.op("Transpose", [query], perm=bsnh), g.ints("q_flat", [0, 0, num_heads * head_dim])])
    out3 = g.name("mha_out")
    g.nodes.append(helper.make_node("MultiHeadAttention", [q3, key, value], [out3], domain=CONTRIB_DOMAIN,
                                    num_heads=num_heads, unidirectional=1, scale=float(scale)))
    out4 = g.op("Reshape", [out3, g.ints("heads", [0, 0, num_heads, head_dim])])
    g.op("Transpose", [out4], output, perm=bsnh)


def build_form(model: onnx.ModelProto, form: str, num_heads: int, num_kv_heads: int,
               head_dim: int) -> onnx.ModelProto | None:
    """`model` with its causal Attention node in `form` (FORMS); None where the graph has no such node."""
    if form == "gqa":
        return cpu_form(model, num_heads, num_kv_heads, head_dim)
    found = _attention(model)
    if found is None or num_heads % num_kv_heads:
        return None
    at, node, scale = found
    scale = float(scale) if scale is not None else head_dim ** -0.5
    query, key, value = node.input
    g = _Graph()
    heads = (num_heads, num_kv_heads, head_dim)
    output = node.output[0]
    builders: dict[str, Callable[[], None]] = {
        "unfused": partial(_unfused, g, query, key, value, output, heads, scale, 1),
        "mha": partial(_mha, g, query, key, value, output, heads, scale),
    }
    blocks = form.removeprefix("blocked")
    if form.startswith("blocked") and blocks.isdigit() and int(blocks) >= 2:
        builders[form] = partial(_unfused, g, query, key, value, output, heads, scale, int(blocks))
    if form not in builders:
        raise ValueError(f"unknown form {form!r}; one of {', '.join(FORMS)}")
    builders[form]()
    result = onnx.ModelProto()
    result.CopyFrom(model)
    nodes = list(result.graph.node)
    del result.graph.node[:]
    result.graph.node.extend(nodes[:at] + g.nodes + nodes[at + 1:])
    result.graph.initializer.extend(g.constants)
    if any(n.domain == CONTRIB_DOMAIN for n in g.nodes) and all(i.domain != CONTRIB_DOMAIN
                                                                for i in result.opset_import):
        result.opset_import.append(helper.make_opsetid(CONTRIB_DOMAIN, 1))
    onnx.checker.check_model(result)
    return result
