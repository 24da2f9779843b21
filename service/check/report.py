"""A check's answer: agreement per tensor, the hypotheses ranked, the verdict and the likely cause.

Shared by the table checks (`posenc.service.check.table_check`) and the attention check
(`posenc.service.check.attention`); nothing here knows which table or model was checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posenc.models.diagnosis.agreement import Agreement, compare, number, residual
from posenc.models.diagnosis.hypothesis import Hypothesis
from posenc.models.errors import ParameterError


@dataclass
class Ranked:
    """One hypothesis against the upload: its largest residual, and whether it explains the upload within the
    precision contract; `found` holds what it fitted (e.g. the theta that explains the table)."""

    name: str
    explanation: str
    residual: float
    explains: bool
    found: dict[str, str] = field(default_factory=dict)


@dataclass
class CheckReport:
    """Agreement per uploaded tensor, the ranked hypotheses and the verdict."""

    agreement: dict[str, Agreement]
    diagnosis: list[Ranked]
    golden: dict[str, str]

    @property
    def verdict(self) -> str:
        return "matches" if all(a.within_contract for a in self.agreement.values()) else "mismatch"

    @property
    def likely_cause(self) -> Ranked | None:
        if self.verdict == "matches" or not self.diagnosis or not self.diagnosis[0].explains:
            return None
        return self.diagnosis[0]

    def document(self) -> dict[str, Any]:
        cause = self.likely_cause
        return {
            "verdict": self.verdict,
            "likely_cause": None if cause is None else cause.name,
            "summary": _summary(self),
            "golden_table": self.golden,
            "agreement": {name: a.summary() for name, a in self.agreement.items()},
            "diagnosis": [{"name": r.name, "residual": number(r.residual), "explains": r.explains,
                           "explanation": r.explanation, **({"found": r.found} if r.found else {})}
                          for r in self.diagnosis],
        }


def _summary(report: CheckReport) -> str:
    cause = report.likely_cause
    if report.verdict == "matches":
        return "matches the reference within the precision contract; no known mistake applies"
    if cause is None:
        return "mismatch; none of the known mistakes explains it (see agreement for where it differs)"
    return f"mismatch: {cause.name} (residual {cause.residual:.3g}) — {cause.explanation}"


def rank(hypotheses: list[Hypothesis], observed: Mapping[str, np.ndarray],
         tolerances: Mapping[str, np.ndarray | float]) -> list[Ranked]:
    """Every hypothesis built (one at a time) and compared with the upload; the ranking of `CheckReport`."""
    ranked: list[Ranked] = []
    for hypothesis in hypotheses:
        try:
            tables = hypothesis.build()
        except ParameterError:  # the mistake is not expressible for these parameters
            continue
        if tables is None:
            continue
        worst, explains = 0.0, True
        for name, array in observed.items():
            worst = max(worst, residual(array, tables[name]))
            explains = explains and array.shape == tables[name].shape and compare(
                array, tables[name], tolerances[name]).within_contract
        del tables
        ranked.append(Ranked(hypothesis.name, hypothesis.explanation, worst, explains, dict(hypothesis.found)))
    # hypotheses that explain the upload (residual within the contract) first, in the family's order (the more
    # specific explanation first); the others by residual
    ranked.sort(key=lambda r: (not r.explains, 0.0 if r.explains else r.residual))
    return ranked


def error_tensors(report: CheckReport) -> dict[str, np.ndarray]:
    """Per-row and per-column maximum absolute errors of each tensor (float64), for binary answers."""
    out: dict[str, np.ndarray] = {}
    for name, a in report.agreement.items():
        out[f"{name}.row_max_abs_error"] = a.row_max_abs
        if a.column_max_abs.size:
            out[f"{name}.column_max_abs_error"] = a.column_max_abs
    return out
