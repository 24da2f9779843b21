"""The attention check: the user's output for an infer request against the model's, with a diagnosis.

The request is a KServe v2 infer request whose inputs carry one extra tensor, `expected_output` (the
user's output, shape and dtype of the model's `output`). The model's own output is the reference;
the hypotheses are the numpy attention of `posenc.models.diagnosis.attention` under each mistake.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from posenc.models.diagnosis.agreement import compare
from posenc.models.diagnosis.attention import AttentionSpec, attention_hypotheses, attention_tolerance
from posenc.service.check.report import CheckReport, rank
from posenc.service.errors import InvalidParameter, PayloadTooLarge, format_bytes

EXPECTED = "expected_output"
WORK_BYTES_PER_SCORE = 8 * 3  # scores, weights and the mask in float64


def bound_attention_work(spec: AttentionSpec | None, inputs: Mapping[str, np.ndarray], max_work_bytes: int) -> int:
    """413 when the numpy attention of every hypothesis would exceed `max_work_bytes`; the hypothesis count."""
    if spec is None:
        return 0
    query = inputs["query"]
    batch, heads, seq = query.shape[0], query.shape[1], query.shape[2]
    count = len(attention_hypotheses(spec, inputs))
    work = count * batch * heads * seq * seq * WORK_BYTES_PER_SCORE
    if work > max_work_bytes:
        raise PayloadTooLarge(f"checking this output against {count} hypotheses takes {format_bytes(work)} of "
                              f"attention scores; the limit is {format_bytes(max_work_bytes)} "
                              "(POSENC_MAX_TABLE_BYTES): check a shorter sequence or a smaller batch")
    return count


def check_attention(model_name: str, config: Mapping[str, object], inputs: Mapping[str, np.ndarray],
                    output: np.ndarray, expected: np.ndarray) -> CheckReport:
    """Agreement of `expected` with the model's `output`, and the ranked attention hypotheses (blocking)."""
    if expected.shape != output.shape:
        raise InvalidParameter(f"{EXPECTED}: shape {list(expected.shape)}, the model's output is "
                               f"{list(output.shape)}")
    if expected.dtype.kind != "f":
        raise InvalidParameter(f"{EXPECTED}: must be a float tensor like the model's output, got {expected.dtype}")
    tolerance = attention_tolerance(output)
    agreement = {"output": compare(expected, output, tolerance)}
    spec = AttentionSpec.from_config(config)
    hypotheses = attention_hypotheses(spec, inputs) if spec is not None else []
    ranked = rank(hypotheses, {"output": expected}, {"output": tolerance})
    return CheckReport(agreement, ranked, {"method": "POST", "url": f"/v2/models/{model_name}/infer"})
