"""One `CheckRequest`: the user's tensors against a registered table, as the route and `posenc check` build it.

`POST /v1/check/{table}` (`posenc.service.check.routes`) and `posenc check` (`posenc.service.cli.check`) both build a
`CheckRequest` from the table's route, its validated query and the check's options, and run it the same
way: `CheckRequest.build` binds the table's own JSON body (`?config=` / `--config`) and refuses what
can be refused before the upload is read (422, 413); `plan` decodes the upload and bounds the work
(blocking); `posenc.service.check.table_check.run` computes the answer (blocking). The route adds only HTTP: reading
the body within the memory budget, worker threads and the response format.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posenc.models.dtypes import FLOAT_DTYPES, dtype_name
from posenc.service.check.report import CheckReport
from posenc.service.check.table_check import CheckPlan, bound_work, decode_upload, held_bytes, plan, run
from posenc.service.errors import BadRequest, InvalidParameter
from posenc.service.settings import Settings
from posenc.service.tables.registry import TableQuery, TableRoute
from posenc.service.tables.rope import CONFIG_BODY
from posenc.service.tables.t5 import WEIGHT_BODY


def check_path(route: TableRoute) -> str:
    """The check route of a table route: `/v1/rope` → `/v1/check/rope`."""
    return "/v1/check/" + route.path.removeprefix("/v1/")


def json_body(route: TableRoute) -> bool:
    """A POST table whose own body is JSON (rope/from-config: the config.json): it travels as `?config=`."""
    body = route.query.body
    return body is not None and "application/json" in body.openapi.get("requestBody", {}).get("content", {})


def checkable(route: TableRoute) -> bool:
    """GET tables, and the POST tables whose own body has a place in a check request."""
    return route.query.body is None or route.query.body is WEIGHT_BODY or json_body(route)


def accepted_tensors(route: TableRoute) -> tuple[str, ...]:
    return (*route.query.tensors, "weight") if route.query.body is WEIGHT_BODY else route.query.tensors


def bind_config(route: TableRoute, query: TableQuery, config: str | None, max_request_bytes: int) -> TableQuery:
    """A JSON-bodied table (rope/from-config: the config.json): its body given as `?config=`, decoded by the
    table's own decoder within the table's own body limit."""
    body = route.query.body
    if body is None or not json_body(route):
        if config is not None:
            raise InvalidParameter(f"config: {route.path} takes no request body of its own")
        return query
    if config is None:
        what = "the Hugging Face config.json" if body is CONFIG_BODY else f"the JSON body of POST {route.path}"
        raise InvalidParameter(f"config: required: {what} (URL-encoded)")
    raw = config.encode()
    limit = min(body.limit or max_request_bytes, max_request_bytes)
    if len(raw) > limit:
        raise InvalidParameter(f"config: {len(raw)} bytes; at most {limit}")
    return query.bind(body.decode(raw, "application/json"))


def bind_weight(route: TableRoute, query: TableQuery, uploaded: dict[str, np.ndarray]) -> TableQuery:
    """t5/bias: the learned table travels as the tensor `weight` (float, as `POST /v1/t5/bias` requires)."""
    if route.query.body is not WEIGHT_BODY:
        return query
    weight = uploaded.pop("weight", None)
    if weight is None:
        raise BadRequest("t5/bias needs the learned table: add the tensor `weight` [num_buckets, num_heads] to the "
                         "safetensors file, next to your `bias`")
    if dtype_name(weight.dtype) not in FLOAT_DTYPES:
        raise InvalidParameter(f"weight: must be a float tensor ({', '.join(FLOAT_DTYPES)}), got "
                               f"{dtype_name(weight.dtype)}")
    bound = query.bind(weight)
    bound.check()
    return bound


@dataclass(frozen=True)
class CheckRequest:
    """A check that passed every test possible before the upload: the table route, its query (bound to the
    table's JSON body where it has one), which tensor a .npy upload is, and the limits it runs under."""

    route: TableRoute
    query: TableQuery
    tensor: str | None
    max_request_bytes: int  # POSENC_MAX_REQUEST_BYTES: the upload
    max_work_bytes: int  # POSENC_MAX_TABLE_BYTES: the reference and every hypothesis, in float64

    @classmethod
    def build(cls, route: TableRoute, query: TableQuery, *, tensor: str | None, config: str | None,
              settings: Settings) -> CheckRequest:
        """Bind `config` and refuse, before any upload is read, what cannot be served: 422 for parameters, 413
        for work over the limit (t5/bias waits for its `weight`, which is part of the upload)."""
        accepted = accepted_tensors(route)
        if tensor is not None and tensor not in accepted:  # before the work bound: a bad name is a 422, not a 413
            raise InvalidParameter(f"tensor: {tensor!r} is not one of {', '.join(accepted)}")
        bound = bind_config(route, query, config, settings.max_request_bytes)
        if route.query.body is not WEIGHT_BODY:
            bound.check()
            bound_work(bound, None, settings.max_table_bytes)
        return cls(route, bound, tensor, settings.max_request_bytes, settings.max_table_bytes)

    @property
    def path(self) -> str:
        return check_path(self.route)

    def held_bytes(self, upload_bytes: int) -> int:
        """What the check holds at its peak for an upload of `upload_bytes` (`table_check.held_bytes`), as far as it
        is known before the upload: t5/bias's table waits for its `weight`, so only its upload is counted (the
        route grows the reservation to the plan's `working_bytes`)."""
        if self.route.query.body is WEIGHT_BODY:
            return 2 * upload_bytes
        return held_bytes(self.query, upload_bytes)

    def plan(self, body: bytes, content_type: str | None) -> CheckPlan:
        """Decode the upload, bind the family's own upload, validate and bound the work (blocking)."""
        uploaded = decode_upload(body, content_type, accepted_tensors(self.route), self.tensor)
        return plan(self.route, bind_weight(self.route, self.query, uploaded), uploaded, self.max_work_bytes,
                    len(body))

    def report(self, body: bytes, content_type: str | None) -> CheckReport:
        """`plan`, then compute the reference, the agreement and the ranked hypotheses (blocking)."""
        return run(self.plan(body, content_type))
