"""KServe v2 / Open Inference Protocol routes (REST), served from the model repository.

`GET /v2`, `/v2/health/live`, `/v2/health/ready`, `GET /v2/models/{name}[/versions/{v}]`, `.../ready`,
`.../stats`, `POST .../infer` (run by the data plane, `posenc.service.inference.dataplane`: the route reads the raw body
itself, as tritonclient sends no Content-Type and binary tensors follow the JSON header,
`Inference-Header-Content-Length`); Triton's repository views (`.../config`, `POST /v2/repository/index`);
`POST /v2/models/{name}/check` (your attention output against the model's); the system shared-memory routes
(`/v2/systemsharedmemory/...`: status, register, unregister).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Annotated, Any

import numpy as np
import pydantic_core
from fastapi import APIRouter, Body, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import StrictBool
from starlette.types import Receive, Scope, Send

from posenc.service.budget import Reservation
from posenc.service.check.attention import EXPECTED
from posenc.service.errors import BadRequest, Unavailable, error_response
from posenc.service.inference.codecs.kserve_json import CLIENT_GONE
from posenc.service.inference.codecs.kserve_request import HEADER_LENGTH, InferRequest, parse_infer_request
from posenc.service.inference.codecs.kserve_response import encode_infer_response_parts, requested_outputs
from posenc.service.inference.dataplane import Buffer, DataPlane, work
from posenc.service.inference.deps import DataPlaneDep
from posenc.service.inference.runtime.repository import VERSION, RepositoryEntry
from posenc.service.inference.shared_memory.registry import RegionsFor
from posenc.service.request_kit import phases
from posenc.service.request_kit.bodies import declared_length, read_aligned_body, read_body, receive_into_of
from posenc.service.request_kit.deps import ReadinessDep
from posenc.service.request_kit.restricted import shared_memory_caller
from posenc.service.request_kit.sending import HeldResponse

router = APIRouter(tags=["inference"])
check_router = APIRouter(tags=["check"])  # beside the table checks
shared_memory_router = APIRouter(tags=["shared memory"])

NameParam = Annotated[str, Path(description="Model name: a folder of the model repository.")]
VersionParam = Annotated[str, Path(description="Model version; every model has version '1'.")]
Parts = tuple[list[Buffer], dict[str, str]]  # an infer answer: its body's parts, and its headers


class HttpInferCall:
    """An HTTP infer (or check) request as the data plane runs it: the body read into one buffer aligned where its
    binary tensors start (`Inference-Header-Content-Length`), parsed as KServe JSON plus binary tensors, answered
    as the JSON header plus views of the outputs (`Parts`)."""

    protocol = "http"

    def __init__(self, request: Request, name: str, version: str | None, limit: int) -> None:
        self.request, self.model_name, self.model_version, self.limit = request, name, version, limit
        self.caller = shared_memory_caller(request.scope)
        self.content_length = request.headers.get("content-length")
        self.header_length = request.headers.get(HEADER_LENGTH)
        self.json_length = _header_length(self.header_length)
        # held until the answer is encoded: the body, the outputs (as large as the query) and their encoding (grown
        # once the inputs are parsed, when the outputs and their JSON text need more: `dataplane.memory_needed`)
        self.reserve_bytes = 3 * declared_length(self.content_length, limit)
        self.held: Reservation | None = None  # nothing held before: the body is read after the reservation

    async def read(self) -> Buffer:
        return await read_aligned_body(self.content_length, self.request.stream(), self.limit,
                                       align_at=self.json_length, receive_into=receive_into_of(self.request.scope))

    def parse_work(self, body: Buffer) -> int:
        return work(self.json_length or len(body))  # binary tensors are views of the body: no work

    def parse(self, body: Buffer, regions: RegionsFor | None) -> tuple[InferRequest, Buffer]:
        return parse_infer_request(body, self.header_length, regions), body

    def encode_work(self, request: InferRequest, outputs: Mapping[str, np.ndarray]) -> int:
        """Outputs answered as JSON text (binary ones are sent as views: no work)."""
        return work(sum(outputs[out.name].nbytes for out in requested_outputs(request, list(outputs))
                        if out.shm is None and not out.binary))

    def encode(self, model_name: str, request: InferRequest, outputs: Mapping[str, np.ndarray],
               order: Sequence[str]) -> Parts:
        return encode_infer_response_parts(model_name, VERSION, request, dict(outputs), order)

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """While a step runs in a worker thread: the client's disconnect stops it (`CLIENT_GONE`: a 499) instead of
        parsing or encoding for nobody."""
        gone = threading.Event()
        watcher = asyncio.create_task(_watch_disconnect(self.request.receive, gone))
        token = CLIENT_GONE.set(gone.is_set)  # copied into the worker thread's context
        try:
            yield
        finally:
            CLIENT_GONE.reset(token)
            watcher.cancel()


async def _watch_disconnect(receive: Receive, gone: threading.Event) -> None:
    """Set `gone` when the client disconnects (the body has been read: nothing else comes from `receive`)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


def _header_length(value: str | None) -> int:
    """Where the binary section starts, for aligning the body buffer (the parser checks the header itself)."""
    ok = value is not None and value.isascii() and value.isdigit() and len(value) <= 18  # int() caps digits
    return int(value) if ok and value is not None else 0


class PartsResponse(HeldResponse):
    """A response whose body is sent as its parts, one ASGI message each (the JSON header, then views of the
    output arrays): nothing is joined into a new buffer. `headers` carry Content-Length and Content-Type;
    `release` runs once every part is sent."""

    def __init__(self, parts: Sequence[Buffer], headers: dict[str, str], *, release: Callable[[], None]) -> None:
        super().__init__(b"", release=release, headers=headers)
        self.parts = parts

    async def send_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        last = len(self.parts) - 1
        for index, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": index < last})


@router.get("/v2", summary="Server metadata")
async def server_metadata(plane: DataPlaneDep) -> dict[str, Any]:
    return plane.server_metadata()


@router.get("/v2/health/live", summary="Server liveness")
async def server_live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready", summary="Server readiness: every model loaded and valid")
async def server_ready(problems: ReadinessDep) -> JSONResponse:
    if problems:
        return error_response(503, Unavailable.error_type, "not ready: " + "; ".join(problems), ready=False)
    return JSONResponse({"ready": True})


@router.get("/v2/models/{name}", summary="Model metadata")
async def model_metadata_route(plane: DataPlaneDep, name: NameParam) -> dict[str, Any]:
    return plane.model_metadata(name)


@router.get("/v2/models/{name}/versions/{version}", summary="Model metadata (version)")
async def model_version_metadata(plane: DataPlaneDep, name: NameParam, version: VersionParam) -> dict[str, Any]:
    return plane.model_metadata(name, version)


def _ready_response(model: RepositoryEntry) -> JSONResponse:
    if not model.ready:
        return error_response(503, Unavailable.error_type, str(model.problem), name=model.name, ready=False)
    return JSONResponse({"name": model.name, "versions": [VERSION], "ready": True})


@router.get("/v2/models/{name}/ready", summary="Model readiness")
async def model_ready(plane: DataPlaneDep, name: NameParam) -> JSONResponse:
    return _ready_response(plane.model(name))


@router.get("/v2/models/{name}/versions/{version}/ready", summary="Model readiness (version)")
async def model_version_ready(plane: DataPlaneDep, name: NameParam, version: VersionParam) -> JSONResponse:
    return _ready_response(plane.model(name, version))


@router.get("/v2/models/{name}/stats", summary="Model statistics (rows inferred, onnxruntime executions)")
async def model_stats(plane: DataPlaneDep, name: NameParam) -> dict[str, Any]:
    return {"model_stats": plane.statistics(name)}


@router.get("/v2/models/{name}/versions/{version}/stats", summary="Model statistics (version)")
async def model_version_stats(plane: DataPlaneDep, name: NameParam, version: VersionParam) -> dict[str, Any]:
    return {"model_stats": plane.statistics(name, version)}


async def _infer(request: Request, plane: DataPlane, name: str, version: str | None) -> Response:
    timed = phases.started(request.scope.get(phases.HEAD_AT))
    phases.lap("route")
    answered = await plane.infer(HttpInferCall(request, name, version, plane.settings.max_request_bytes))
    parts, headers = answered.value
    # the answer's bytes stay counted until the kernel has them (posenc.service.request_kit.sending)
    answered.reservation.shrink(sum(len(part) for part in parts))
    if plane.settings.server_timing:
        headers[phases.HEADER] = timed.value()
    return PartsResponse(parts, headers, release=answered.release)


@router.post("/v2/models/{name}/infer", summary="Inference (JSON or binary tensors)")
async def infer(request: Request, name: NameParam, plane: DataPlaneDep) -> Response:
    return await _infer(request, plane, name, None)


@router.post("/v2/models/{name}/versions/{version}/infer", summary="Inference (version)")
async def infer_version(request: Request, name: NameParam, version: VersionParam, plane: DataPlaneDep) -> Response:
    return await _infer(request, plane, name, version)


# Triton's model-repository views

@router.get("/v2/models/{name}/config", summary="Model configuration (Triton's model_config as JSON)")
async def model_config(plane: DataPlaneDep, name: NameParam) -> dict[str, Any]:
    return plane.model_config(name)


@router.get("/v2/models/{name}/versions/{version}/config", summary="Model configuration (version)")
async def model_version_config(plane: DataPlaneDep, name: NameParam, version: VersionParam) -> dict[str, Any]:
    return plane.model_config(name, version)


@router.post("/v2/repository/index", summary="Every model of the repository and its state (Triton's index)")
async def repository_index_route(
    plane: DataPlaneDep,
    ready: Annotated[StrictBool, Body(embed=True, description="Only the models that are ready to serve.")] = False,
) -> list[dict[str, str]]:
    return plane.repository_index(ready)


# Check your attention output against the model's: an infer request plus `expected_output`

BODY_DOC = {
    "requestBody": {
        "required": True,
        "description": "A KServe v2 infer request (JSON, or the binary tensor extension) whose inputs also hold "
                       f"`{EXPECTED}`: your output for these inputs (shape and datatype of the model's output).",
        "content": {"application/json": {"schema": {"type": "object"}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@check_router.post("/v2/models/{name}/check", summary="Check your attention output against the model's",
                   openapi_extra=BODY_DOC, response_class=JSONResponse)
async def check_model(request: Request, name: NameParam, plane: DataPlaneDep) -> JSONResponse:
    """Runs the infer request through the model and compares your `expected_output` with its output; the
    diagnosis ranks missing causal mask, 1/D scale, GQA grouping, RoPE on v and positions not passed."""
    answered = await plane.check(HttpInferCall(request, name, None, plane.settings.max_request_bytes))
    answered.release()
    return JSONResponse(answered.value)


# System shared memory (on when POSENC_SHARED_MEMORY=true, else each answers 400); the registry is
# posenc.service.inference.shared_memory.registry. Register and unregister answer an empty 200, as Triton does. Each
# caller sees and changes only its own regions (its uid on the Unix socket; the key's holders over TCP).

REGISTER_BODY_LIMIT = 64 * 1024
RegionParam = Annotated[str, Path(description="Name the region is registered under.")]


@shared_memory_router.get("/v2/systemsharedmemory/status",
                          summary="Status of every registered system shared-memory region")
async def status_all(request: Request, plane: DataPlaneDep) -> list[dict[str, Any]]:
    return await plane.shared_memory_status(shared_memory_caller(request.scope), None, request.url.path)


@shared_memory_router.get("/v2/systemsharedmemory/region/{name}/status",
                          summary="Status of one system shared-memory region")
async def status_one(request: Request, plane: DataPlaneDep, name: RegionParam) -> list[dict[str, Any]]:
    return await plane.shared_memory_status(shared_memory_caller(request.scope), name, request.url.path)


@shared_memory_router.post("/v2/systemsharedmemory/region/{name}/register",
                           summary="Register a system shared-memory region")
async def register(request: Request, plane: DataPlaneDep, name: RegionParam) -> Response:
    caller = shared_memory_caller(request.scope)
    plane.require_shared_memory(caller, request.url.path)  # refused before its body is read
    body = await read_body(request.headers.get("content-length"), request.stream(), REGISTER_BODY_LIMIT)
    try:
        parsed = pydantic_core.from_json(body)
    except ValueError as exc:
        raise BadRequest(f"register: the body is not valid JSON: {exc}") from None
    await plane.register(caller, name, parsed, request.url.path)
    return Response(status_code=200)


@shared_memory_router.post("/v2/systemsharedmemory/region/{name}/unregister",
                           summary="Unregister a system shared-memory region")
async def unregister(request: Request, plane: DataPlaneDep, name: RegionParam) -> Response:
    await plane.unregister(shared_memory_caller(request.scope), name, request.url.path)
    return Response(status_code=200)


@shared_memory_router.post("/v2/systemsharedmemory/unregister",
                           summary="Unregister every system shared-memory region")
async def unregister_all(request: Request, plane: DataPlaneDep) -> Response:
    await plane.unregister(shared_memory_caller(request.scope), None, request.url.path)
    return Response(status_code=200)
