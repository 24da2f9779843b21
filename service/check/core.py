"""One check: the user's tensors against the reference table of a registered family, and the diagnosis.

`decode_upload` reads the user's tensors with the decoders of `POST /v1/t5/bias` (same rules, same
4xx); `plan` validates them against the query's declared tensors and bounds the work before any
table is computed (413); `run` computes the reference, the agreement of each tensor and every
hypothesis, one hypothesis table in memory at a time, and ranks them by residual.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import numpy as np

from models.diagnosis.agreement import Agreement, compare, number, residual
from models.diagnosis.hypothesis import Hypothesis, Tables
from models.dtypes import dtype_name
from models.errors import ParameterError
from service.check.families import FamilyCheck, family_check
from service.errors import BadRequest, InvalidParameter, PayloadTooLarge
from service.tables.registry import TableQuery, TableRoute, format_bytes, metadata_value
from service.uploads import decode_npy, decode_safetensors, upload_format

WORK_BYTES_PER_ELEMENT = 8  # every comparison runs in float64


def _safetensors_names(body: bytes) -> list[str]:
    """Tensor names of a safetensors body `decode_safetensors` has already validated."""
    (length,) = struct.unpack_from("<Q", body, 0)
    return [name for name in json.loads(body[8:8 + length]) if name != "__metadata__"]


def decode_upload(body: bytes, content_type: str | None, accepted: tuple[str, ...],
                  npy_name: str | None = None) -> dict[str, np.ndarray]:
    """The uploaded tensors by name: .npy is one tensor (`npy_name`, default the first accepted name);
    safetensors holds any of `accepted` (a file with one tensor of another name counts as the first)."""
    if upload_format(content_type, body[:16]) == "npy":
        name = npy_name or accepted[0]
        if name not in accepted:
            raise InvalidParameter(f"tensor: {name!r} is not one of {', '.join(accepted)}")
        return {name: decode_npy(body)}
    first = decode_safetensors(body, accepted[0]) if len(accepted) == 1 else None
    names = _safetensors_names(body)
    if first is not None and len(names) == 1:
        return {accepted[0]: first}
    unknown = [n for n in names if n not in accepted]
    if unknown or not names:
        raise BadRequest(f"safetensors: tensors {', '.join(unknown) or '(none)'} are not checked here; "
                         f"this endpoint takes {', '.join(accepted)}")
    return {name: decode_safetensors(body, name) for name in names}


@dataclass
class CheckPlan:
    """A validated check: the query (bound), the user's tensors, the hypotheses and the work they cost."""

    route: TableRoute
    query: TableQuery
    observed: dict[str, np.ndarray]
    family: FamilyCheck
    hypotheses: list[Hypothesis]
    working_bytes: int


def plan(route: TableRoute, query: TableQuery, uploaded: Mapping[str, np.ndarray], max_work_bytes: int) -> CheckPlan:
    """Validate the upload against the declared tensors and bound the work (413) before computing."""
    query.check()
    specs = query.specs()
    observed = {name: array for name, array in uploaded.items() if name in specs}
    if not observed:
        raise BadRequest(f"the upload holds none of this table's tensors ({', '.join(specs)})")
    for name, array in observed.items():
        spec = specs[name]
        if array.shape != spec.shape:
            raise InvalidParameter(f"{name}: your tensor has shape {list(array.shape)}, the request describes "
                                   f"{list(spec.shape)}; check the parameters (rows, dims, heads)")
        if (array.dtype.kind in "iub") != (spec.dtype.kind in "iub"):
            raise InvalidParameter(f"{name}: your tensor is {dtype_name(array.dtype)}, the table is "
                                   f"{dtype_name(spec.dtype)} (integers and floats are not compared)")
    family = family_check(query)
    hypotheses = family.hypotheses(query, query_tables(query), observed)
    held = bound_work(query, len(hypotheses), max_work_bytes)
    return CheckPlan(route, query, observed, family, hypotheses, held)


def bound_work(query: TableQuery, hypotheses: int | None, max_work_bytes: int) -> int:
    """413 when the reference, the upload and every hypothesis (each compared in float64) exceed
    `max_work_bytes`; else the bytes held at once. `hypotheses` None: count them (before any upload)."""
    if hypotheses is None:
        hypotheses = len(family_check(query).hypotheses(query, query_tables(query), {}))
    reference_size = sum(spec.size for spec in query.specs().values())
    work = (hypotheses + 2) * reference_size * WORK_BYTES_PER_ELEMENT
    if work > max_work_bytes:
        raise PayloadTooLarge(f"checking this table against {hypotheses} hypotheses takes "
                              f"{format_bytes(work)} of work; the limit is {format_bytes(max_work_bytes)} "
                              "(POSENC_MAX_TABLE_BYTES): check fewer rows, or slices with offset")
    # held at once: reference, upload, one hypothesis, and their float64 differences
    return 6 * reference_size * WORK_BYTES_PER_ELEMENT


def query_tables(query: TableQuery) -> Any:
    """The reference tensors of `query`, computed on first use and kept."""
    memo: dict[str, Tables] = {}

    def reference() -> Tables:
        if "tables" not in memo:
            memo["tables"] = dict(query.compute().tensors)
        return memo["tables"]

    return reference


@dataclass
class Ranked:
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
        return "matches the reference within the precision contract"
    if cause is None:
        return "mismatch; none of the known mistakes explains it (see agreement for where it differs)"
    return f"mismatch: {cause.name} (residual {cause.residual:.3g}) — {cause.explanation}"


def golden_request(route: TableRoute, query: TableQuery) -> dict[str, str]:
    """The table request that returns the reference: its method and URL (parameters as given)."""
    given = {name: metadata_value(value) for name, value in query.model_dump(exclude_unset=True).items()
             if value is not None}
    url = route.path + ("?" + urlencode(given) if given else "")
    return {"method": route.method, "url": url}


def run(check: CheckPlan) -> CheckReport:
    """Compute the reference, compare, evaluate every hypothesis (blocking: call from a worker thread)."""
    reference = check.query.compute().tensors
    tolerances = check.family.tolerances(check.query, reference)
    agreement = {name: compare(array, reference[name], tolerances[name]) for name, array in check.observed.items()}
    del reference
    ranked = rank(check.hypotheses, check.observed, tolerances)
    return CheckReport(agreement, ranked, golden_request(check.route, check.query))


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
