"""Table routes built from the registry: one GET (or POST, for families with a body) per `TableRoute`.

A GET route validates its query model (FastAPI's query-parameter models: 422 naming the parameter)
and answers in a worker thread. A POST route checks its parameters and the format first, then reads
the body (bounded), and decodes, binds and answers in a worker thread: hashing or decoding an upload
never blocks the event loop.
"""

from collections.abc import Callable, Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from posenc.service.budget import RELEASE_AFTER_BYTES, BodiesInFlight, MemoryBudget, release_free_memory
from posenc.service.codec.encode import FORMATS, negotiate_format
from posenc.service.request_kit.bodies import declared_length, read_body
from posenc.service.request_kit.deps import BodiesInFlightDep, MemoryBudgetDep, SettingsDep, ThreadKindsDep
from posenc.service.request_kit.sending import HeldResponse
from posenc.service.request_kit.threads import TABLE_WORK, ThreadKinds
from posenc.service.tables import TABLES
from posenc.service.tables.answer import Answer, Pending, TableRequest
from posenc.service.tables.deps import RowBlocksDep, TableCacheDep
from posenc.service.tables.registry import TableQuery, TableRoute

# After a computation this large, freed memory is handed back to the system (allocator fragmentation).


async def table_request(
    request: Request,
    settings: SettingsDep,
    cache: TableCacheDep,
    blocks: RowBlocksDep,
    format: Annotated[
        str | None,
        Query(description="Response format: " + ", ".join(FORMATS) + ". Wins over the Accept header; "
              "default safetensors."),
    ] = None,
    tensor: Annotated[
        str | None, Query(description="Name of the one tensor to return (required for npy/raw when the "
                                      "endpoint returns several).")
    ] = None,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
    if_none_match: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> TableRequest:
    return TableRequest(
        format=negotiate_format(format, accept),
        tensor=tensor,
        settings=settings,
        cache=cache,
        if_none_match=if_none_match,
        method=request.method,
        blocks=blocks,
    )


TableDep = Annotated[TableRequest, Depends(table_request)]


CACHE_KEY_SCOPE = "posenc.cache_key"  # set on the request scope: the fast path learns the request's spelling


def to_response(answer: Answer, release: Callable[[], None] | None = None) -> Response:
    """The answer as a response; with `release`, one that calls it once its body is sent (`HeldResponse`)."""
    if release is None:
        return Response(content=answer.body, status_code=answer.status, media_type=answer.media_type,
                        headers=answer.headers)
    return HeldResponse(answer.body, release=release, status_code=answer.status, media_type=answer.media_type,
                        headers=answer.headers)


def _response(request: Request, answer: Answer, release: Callable[[], None]) -> Response:
    if answer.cache_key is not None:
        request.scope[CACHE_KEY_SCOPE] = answer.cache_key
    return to_response(answer, release)


def _decode_and_prepare(table: TableRequest, query: TableQuery, decode: Callable[[bytes, str | None], Any],
                        body: bytes, content_type: str | None) -> Answer | Pending:
    return table.prepare(query.bind(decode(body, content_type)))


async def _complete(request: Request, table: TableRequest, budget: MemoryBudget, bodies: BodiesInFlight,
                    kinds: ThreadKinds, prepared: Answer | Pending) -> Response:
    """A 304 or cache hit as it is; a miss computed in a worker thread within the memory budget. Either
    way the body stays counted in the budget until it is sent (`BodiesInFlight`): a miss keeps the body's
    share of its reservation, a hit shares (or reserves) its cached body's."""
    what = f"/v1/{prepared.query.endpoint}" if isinstance(prepared, Pending) else request.url.path
    if isinstance(prepared, Answer):
        return _response(request, prepared, await bodies.share(prepared.body, what))
    reservation = await budget.acquire(prepared.working_bytes, what)
    try:
        answer = await kinds.run(TABLE_WORK, table.complete, prepared)  # tables' own threads (waiting for the blocks)
    except BaseException:
        reservation.release()
        raise
    release = bodies.adopt(answer.body, reservation)
    if prepared.working_bytes >= RELEASE_AFTER_BYTES:
        await run_in_threadpool(release_free_memory)
    return _response(request, answer, release)


def _endpoint(route: TableRoute) -> Any:
    """The route function; its signature names the query model so FastAPI documents every field."""
    query_model = route.query

    if query_model.body is None:
        async def get_table(request: Request, query: Annotated[query_model, Query()],  # type: ignore[valid-type]
                            table: TableDep, budget: MemoryBudgetDep, bodies: BodiesInFlightDep,
                            kinds: ThreadKindsDep) -> Response:
            return await _complete(request, table, budget, bodies, kinds,
                                   await run_in_threadpool(table.prepare, query))

        return get_table

    body_limit, decode = query_model.body.limit, query_model.body.decode

    async def post_table(request: Request, query: Annotated[query_model, Query()],  # type: ignore[valid-type]
                         table: TableDep, budget: MemoryBudgetDep, bodies: BodiesInFlightDep,
                         kinds: ThreadKindsDep) -> Response:
        parameters: TableQuery = query
        parameters.check()  # before the body: nothing is read for a request that cannot be served
        limit = min(body_limit or table.settings.max_request_bytes, table.settings.max_request_bytes)
        # the body, and its decoded copy, are held until the table is prepared
        async with budget.reserve(2 * declared_length(request.headers.get("content-length"), limit), "an upload"):
            body = await read_body(request.headers.get("content-length"), request.stream(), limit)
            prepared = await run_in_threadpool(_decode_and_prepare, table, parameters, decode, body,
                                               request.headers.get("content-type"))
            del body
        return await _complete(request, table, budget, bodies, kinds, prepared)

    return post_table


def add_table_routes(router: APIRouter, routes: Iterable[TableRoute]) -> APIRouter:
    """`router` with a route answered by `TableRequest` for each of `routes` (formats, ETag, cache, limits)."""
    for route in routes:
        body = route.query.body
        router.add_api_route(
            route.path, _endpoint(route), methods=[route.method], summary=route.summary,
            description=(route.query.__doc__ or "").strip(), response_description=route.response_description,
            openapi_extra=dict(body.openapi) if body else None, response_class=Response,
        )
    return router


def table_router() -> APIRouter:
    """Every registered table route."""
    return add_table_routes(APIRouter(tags=["tables"]), TABLES.values())
