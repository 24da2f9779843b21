"""`POST /v1/check/{table}`: the user's tensors against a registered table, with a diagnosis.

One route per registered table family (built from `posenc.service.tables.TABLES`, so every family that
registers is checkable): the query string is the family's own query model (same names, bounds and
defaults), the body is the user's tensors as safetensors (several tensors by name) or .npy (one,
named by `?tensor=`), read with the upload rules of `POST /v1/t5/bias`. Families whose table needs
a body of its own take it alongside: `POST /v1/rope/from-config`'s config.json as `?config=`, and
`POST /v1/t5/bias`'s learned table as the tensor `weight` of the same safetensors file. The check itself
is a `posenc.service.check.request.CheckRequest`, the same that `posenc check` runs; this module adds HTTP.
"""


from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from posenc.service.budget import RELEASE_AFTER_BYTES, release_free_memory
from posenc.service.check.report import CheckReport, error_tensors
from posenc.service.check.request import CheckRequest, check_path, checkable, json_body
from posenc.service.check.table_check import run
from posenc.service.codec.decode import upload_request_body
from posenc.service.codec.encode import MEDIA_TYPES, encode_safetensors
from posenc.service.errors import NotAcceptable, echo
from posenc.service.request_kit.bodies import declared_length, read_body
from posenc.service.request_kit.deps import MemoryBudgetDep, SettingsDep, ThreadKindsDep
from posenc.service.request_kit.threads import CHECK_WORK
from posenc.service.tables import TABLES
from posenc.service.tables.registry import TableRoute

CHECK_FORMATS = ("json", "safetensors")

BODY_DOC = {"requestBody": upload_request_body(
    "Your tensors: safetensors (each under the endpoint's tensor name, e.g. `cos` and `sin`; for t5/bias also the "
    "learned table `weight`) or one .npy (named by `?tensor=`).")}


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


FormatQuery = Annotated[str | None, Query(description="json (default): agreement and diagnosis; safetensors: "
                                                      "per-row and per-column maximum errors.")]
TensorQuery = Annotated[str | None, Query(description="Which tensor a .npy upload is (default: the first of the "
                                                      "endpoint's tensors).")]


async def check_options(format: FormatQuery = None, tensor: TensorQuery = None,
                        config: Annotated[str | None, Query(include_in_schema=False)] = None) -> CheckOptions:
    """The check's own query parameters (a dependency: the family's query model holds the rest). `config` is
    not in this route's document: its table has no JSON body, and a `config` is refused (422)."""
    return CheckOptions(format or "json", tensor, config)


async def check_options_with_config(
    config: Annotated[str, Query(description="The table's own JSON body, URL-encoded (rope/from-config: the "
                                             "config.json; rope/mrope: the sequence description).")],
    format: FormatQuery = None, tensor: TensorQuery = None,
) -> CheckOptions:
    """`check_options` of a table read from a JSON body only: that body travels as the required `?config=`."""
    return CheckOptions(format or "json", tensor, config)


def _endpoint(route: TableRoute) -> Any:
    query_model = route.query
    options_of = check_options_with_config if json_body(route) else check_options

    async def check_table(request: Request, query: Annotated[query_model, Query()],  # type: ignore[valid-type]
                          options: Annotated[CheckOptions, Depends(options_of)], settings: SettingsDep,
                          budget: MemoryBudgetDep, kinds: ThreadKindsDep) -> Response:
        if options.format not in CHECK_FORMATS:
            raise NotAcceptable(f"format: {echo(options.format)} is not served by a check; use "
                                f"{' or '.join(CHECK_FORMATS)}")
        # before the body: nothing is read for a request that cannot be served
        check = CheckRequest.build(route, query, tensor=options.tensor, config=options.config, settings=settings)
        limit = check.max_request_bytes
        # one reservation, made before the body is read, for the upload and the work of its check together: never
        # an upload held while it waits for its work's share
        declared = declared_length(request.headers.get("content-length"), limit)
        reservation = await budget.acquire(check.held_bytes(declared), check.path)
        try:
            body = await read_body(request.headers.get("content-length"), request.stream(), limit)
            planned = await kinds.run(CHECK_WORK, check.plan, body, request.headers.get("content-type"))
            del body
            # the upload's real length (a chunked body was counted at the limit); t5/bias: its table, now known
            reservation.shrink(planned.working_bytes)
            await reservation.grow(planned.working_bytes, check.path)
            report = await kinds.run(CHECK_WORK, run, planned)  # checks' own threads: other kinds keep theirs
            held = planned.working_bytes
            del planned  # the decoded upload
        finally:
            reservation.release()
        if held >= RELEASE_AFTER_BYTES:  # as after a large table: glibc's heaps keep no more than they may
            await run_in_threadpool(release_free_memory)
        return respond(report, options.format)

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
