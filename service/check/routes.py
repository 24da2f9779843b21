"""`POST /v1/check/{table}`: the user's tensors against a registered table, with a diagnosis.

One route per registered table family (built from `service.tables.TABLES`, so every family that
registers is checkable): the query string is the family's own query model (same names, bounds and
defaults), the body is the user's tensors as safetensors (several tensors by name) or .npy (one,
named by `?tensor=`), read with the upload rules of `POST /v1/t5/bias`. Families whose table needs
a body of its own take it alongside: `POST /v1/rope/from-config`'s config.json as `?config=`, and
`POST /v1/t5/bias`'s learned table as the tensor `weight` of the same safetensors file.
"""


from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from models.dtypes import FLOAT_DTYPES, dtype_name
from service.arrays import MEDIA_TYPES, encode_safetensors
from service.budget import MemoryBudget
from service.check.core import CheckPlan, CheckReport, bound_work, decode_upload, error_tensors, plan, run
from service.errors import BadRequest, InvalidParameter, NotAcceptable, echo
from service.tables import TABLES
from service.tables.registry import TableQuery, TableRoute
from service.tables.rope import CONFIG_BODY
from service.tables.t5 import WEIGHT_BODY
from service.uploads import declared_length, read_body, upload_request_body

CHECK_FORMATS = ("json", "safetensors")

BODY_DOC = {"requestBody": upload_request_body(
    "Your tensors: safetensors (each under the endpoint's tensor name, e.g. `cos` and `sin`; for t5/bias also the "
    "learned table `weight`) or one .npy (named by `?tensor=`).")}


def check_path(route: TableRoute) -> str:
    return "/v1/check/" + route.path.removeprefix("/v1/")


def json_body(route: TableRoute) -> bool:
    """A POST table whose own body is JSON (rope/from-config's config.json): it travels as `?config=`."""
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


def prepare(route: TableRoute, query: TableQuery, body: bytes, content_type: str | None, tensor: str | None,
            max_work_bytes: int) -> CheckPlan:
    """Decode the upload, bind the family's own upload, validate and bound the work (blocking)."""
    uploaded = decode_upload(body, content_type, accepted_tensors(route), tensor)
    return plan(route, bind_weight(route, query, uploaded), uploaded, max_work_bytes)


def respond(report: CheckReport, fmt: str) -> Response:
    if fmt == "json":
        return JSONResponse(report.document())
    cause = report.likely_cause
    metadata = {"verdict": report.verdict, "likely_cause": "" if cause is None else cause.name,
                "golden_table": report.golden["url"]}
    return Response(encode_safetensors(error_tensors(report), metadata), media_type=MEDIA_TYPES["safetensors"])


@dataclass(frozen=True)
class CheckOptions:
    format: str
    tensor: str | None
    config: str | None


async def check_options(
    format: Annotated[str | None, Query(description="json (default): agreement and diagnosis; safetensors: "
                                                    "per-row and per-column maximum errors.")] = None,
    tensor: Annotated[str | None, Query(description="Which tensor a .npy upload is (default: the first "
                                                    "of the endpoint's tensors).")] = None,
    config: Annotated[str | None, Query(description="Tables read from a JSON body only: that body, URL-encoded "
                                                    "(rope/from-config: the config.json).")] = None,
) -> CheckOptions:
    """The check's own query parameters (a dependency: the family's query model holds the rest)."""
    return CheckOptions(format or "json", tensor, config)


def _endpoint(route: TableRoute) -> Any:
    query_model = route.query

    async def check_table(request: Request, query: Annotated[query_model, Query()],  # type: ignore[valid-type]
                          options: Annotated[CheckOptions, Depends(check_options)]) -> Response:
        fmt, tensor, config = options.format, options.tensor, options.config
        if fmt not in CHECK_FORMATS:
            raise NotAcceptable(f"format: {echo(fmt)} is not served by a check; use {' or '.join(CHECK_FORMATS)}")
        settings = request.app.state.settings
        parameters = bind_config(route, query, config, settings.max_request_bytes)
        if route.query.body is not WEIGHT_BODY:
            # before the body: nothing is read for a request that cannot be served
            parameters.check()
            bound_work(parameters, None, settings.max_table_bytes)
        budget: MemoryBudget = request.app.state.memory_budget
        limit = settings.max_request_bytes
        async with budget.reserve(2 * declared_length(request.headers.get("content-length"), limit), "an upload"):
            body = await read_body(request.headers.get("content-length"), request.stream(), limit)
            checked = await run_in_threadpool(prepare, route, parameters, body, request.headers.get("content-type"),
                                              tensor, settings.max_table_bytes)
            del body
        async with budget.reserve(checked.working_bytes, check_path(route)):
            report = await run_in_threadpool(run, checked)
        return respond(report, fmt)

    return check_table


def check_router() -> APIRouter:
    """A check route for every registered table whose request can carry the user's tensors."""
    router = APIRouter(tags=["check"])
    for route in TABLES.values():
        if checkable(route):
            router.add_api_route(
                check_path(route), _endpoint(route), methods=["POST"],
                summary=f"Check your {route.path} table: agreement and a diagnosis",
                description=f"Compares your tensors with `{route.method} {route.path}` (same query parameters) and "
                            "ranks the known porting mistakes by how well each explains the difference.",
                openapi_extra=BODY_DOC, response_class=JSONResponse,
            )
    return router
