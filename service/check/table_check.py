"""One check: the user's tensors against the reference table of a registered family, and the diagnosis.

`decode_upload` reads the user's tensors with the decoders of `POST /v1/t5/bias` (same rules, same
4xx); `plan` validates them against the query's declared tensors and bounds the work before any
table is computed (413); `run` computes the reference, the agreement of each tensor and every
hypothesis, one hypothesis table in memory at a time, and ranks them (`posenc.service.check.report.rank`).
The request that drives these steps, for the route and `posenc check` alike, is
`posenc.service.check.request.CheckRequest`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import numpy as np

from posenc.models.diagnosis.agreement import COMPARE_FLOAT64_ARRAYS, compare
from posenc.models.diagnosis.hypothesis import Hypothesis, Tables
from posenc.models.dtypes import dtype_name
from posenc.service.check.families import FamilyCheck, family_check
from posenc.service.check.report import CheckReport, rank
from posenc.service.codec.decode import decode_npy, decode_safetensors, upload_format
from posenc.service.errors import BadRequest, InvalidParameter, PayloadTooLarge, format_bytes
from posenc.service.tables.answer import metadata_value
from posenc.service.tables.registry import TableQuery, TableRoute

WORK_BYTES_PER_ELEMENT = 8  # every comparison runs in float64
# What a running check holds at once beside the user's decoded tensors, in float64 arrays of the reference's size:
# the tolerances, the reference (or, while the hypotheses are ranked, one hypothesis's tables), and the working set
# of the comparison (`compare`; `residual` holds less). Measured at most 6.2 (tests/api/test_check_memory.py).
CHECK_FLOAT64_ARRAYS = 2 + COMPARE_FLOAT64_ARRAYS


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
    working_bytes: int  # `held_bytes` of the query and the upload


def plan(route: TableRoute, query: TableQuery, uploaded: Mapping[str, np.ndarray], max_work_bytes: int,
         upload_bytes: int) -> CheckPlan:
    """Validate the upload (`upload_bytes` long) against the declared tensors and bound the work (413) before
    computing."""
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
    bound_work(query, len(hypotheses), max_work_bytes)
    return CheckPlan(route, query, observed, family, hypotheses, held_bytes(query, upload_bytes))


def bound_work(query: TableQuery, hypotheses: int | None, max_work_bytes: int) -> None:
    """413 when the reference, the upload and every hypothesis (each compared in float64) exceed
    `max_work_bytes`. `hypotheses` None: count them (before any upload)."""
    if hypotheses is None:
        hypotheses = len(family_check(query).hypotheses(query, query_tables(query), {}))
    work = (hypotheses + 2) * reference_size(query) * WORK_BYTES_PER_ELEMENT
    if work > max_work_bytes:
        raise PayloadTooLarge(f"checking this table against {hypotheses} hypotheses takes "
                              f"{format_bytes(work)} of work; the limit is {format_bytes(max_work_bytes)} "
                              "(POSENC_MAX_TABLE_BYTES): check fewer rows, or slices with offset")


def reference_size(query: TableQuery) -> int:
    """Elements of the reference tables (every tensor of the query)."""
    return sum(spec.size for spec in query.specs().values())


def held_bytes(query: TableQuery, upload_bytes: int) -> int:
    """The most a check of `query` holds at once for an upload of `upload_bytes`: the body and its decoded tensors
    (no larger) while the upload is read and decoded, then the decoded tensors beside the work of the check
    (`CHECK_FLOAT64_ARRAYS`). The route reserves it in the memory budget before the body is read."""
    work = CHECK_FLOAT64_ARRAYS * reference_size(query) * WORK_BYTES_PER_ELEMENT
    return upload_bytes + max(upload_bytes, work)


def query_tables(query: TableQuery) -> Any:
    """The reference tensors of `query`, computed on first use and kept."""
    memo: dict[str, Tables] = {}

    def reference() -> Tables:
        if "tables" not in memo:
            memo["tables"] = dict(query.compute().tensors)
        return memo["tables"]

    return reference


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
    # a hypothesis explains a mismatch only: on a match none applies, and none is computed
    matches = all(a.within_contract for a in agreement.values())
    ranked = [] if matches else rank(check.hypotheses, check.observed, tolerances)
    return CheckReport(agreement, ranked, golden_request(check.route, check.query))
