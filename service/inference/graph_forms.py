"""Which of a model's two graphs runs a request on the CPU: the CPU form from the sequence length measured on
this machine (`posenc.service.inference.calibration`), or pinned.

A model exported with a CPU form (`posenc.models.export.cpu_form`: `model.cpu.onnx`, its causal attention as
onnxruntime's GroupQueryAttention) has two sessions on the CPU. Neither is faster everywhere: on 2 cores
the CPU form ran llama3_1_attention at B=1, S=1024 1.48x faster and rope_attention at B=1, S=128 1.6x
slower (its per-head loops pay off once a head's score matrix outgrows the cache; below that its extra
transposes and per-head overhead dominate), and where it starts to win depends on the CPU. Start-up measures
both at growing sequence lengths and keeps the shortest from which the CPU form stays faster; runs of that
sequence length or longer take it. The rule is fixed per model, so one request always runs on
the same graph and gets the same bits (the two graphs agree to about 1e-6, not bit for bit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

STANDARD = "model.onnx"


@dataclass(frozen=True)
class GraphForms:
    """The standard session, the CPU form's, and from which sequence length the CPU form runs."""

    standard: ort.InferenceSession
    cpu_form: ort.InferenceSession
    cpu_form_file: str
    from_sequence: int | None  # None: the CPU form never runs
    sequence_axes: Mapping[str, int]  # input name -> its sequence axis
    rule: str = "config.json"  # where from_sequence came from (calibrated, cached, pinned, config.json)

    def pick(self, inputs: Mapping[str, np.ndarray]) -> tuple[str, ort.InferenceSession]:
        """(file, session) that runs `inputs`: the CPU form when their sequence is `from_sequence` or longer."""
        if self.from_sequence is None:
            return STANDARD, self.standard
        seq = next((inputs[name].shape[axis] for name, axis in self.sequence_axes.items() if name in inputs), 0)
        if seq >= self.from_sequence:
            return self.cpu_form_file, self.cpu_form
        return STANDARD, self.standard
