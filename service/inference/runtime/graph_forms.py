"""Which of a model's graphs runs a request on the CPU: by its sequence length, from the rule measured on this
machine (`posenc.service.inference.runtime.calibration`), or pinned.

A model exported with CPU forms (`posenc.models.export.cpu_forms`) has several graphs of one attention on the CPU:
model.onnx (the opset-23 Attention node), model.cpu.onnx (GroupQueryAttention) and model.blocked<N>.onnx
(MatMul/Softmax/MatMul in N query blocks that skip the masked keys). None is fastest everywhere: on a 2-core Xeon,
one thread, rope_attention ran fastest in 4 blocks at S=128 and in 8 at S=512, llama3_1_attention in 16 at S=1024
(1.4-2.5x faster than model.onnx), and on a 2-core AMD EPYC VM the blocked forms too, with GroupQueryAttention
second at llama3_1_attention's S=512-1024 (docs/performance.md). Start-up times every graph at growing sequence
lengths and keeps, per length, the fastest; a request runs on the graph of its length. The rule is fixed per model
for the life of the process, so one request always runs on the same graph and gets the same bits (the graphs agree
to about 1e-6, not bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from posenc.models.graph_rule import STANDARD_FILE as STANDARD
from posenc.models.graph_rule import describe, file_for

__all__ = ["STANDARD", "GraphForms"]


@dataclass(frozen=True)
class GraphForms:
    """Every CPU session of a model by file (model.onnx too), and the rule: the file that runs from each sequence
    length ((from_sequence, file), ascending, the first from 1)."""

    sessions: Mapping[str, ort.InferenceSession]
    rule: Sequence[tuple[int, str]]
    sequence_axes: Mapping[str, int]  # input name -> its sequence axis
    how: str = "config.json"  # where the rule came from (calibrated, cached, pinned, config.json)

    def file_for(self, seq: int) -> str:
        """The graph that runs a sequence of `seq`."""
        return file_for(self.rule, seq)

    def pick(self, inputs: Mapping[str, np.ndarray]) -> tuple[str, ort.InferenceSession]:
        """(file, session) that runs `inputs`."""
        seq = next((inputs[name].shape[axis] for name, axis in self.sequence_axes.items() if name in inputs), 0)
        file = self.file_for(seq)
        return file, self.sessions[file]

    def describe(self) -> str:
        """The rule in words (`posenc.models.graph_rule.describe`)."""
        return describe(self.rule)
