"""KServe v2 / Open Inference Protocol routes (REST), served from the model repository.

`GET /v2`, `/v2/health/live`, `/v2/health/ready`, `GET /v2/models/{name}[/versions/{v}]`,
`.../ready`, `.../stats`, `POST .../infer`. The infer route reads the raw body itself: tritonclient
sends no Content-Type, and binary tensors follow the JSON header (`Inference-Header-Content-Length`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response

from service import __version__
from service.budget import MemoryBudget
from service.engine import VERSION, Engine, RepositoryEntry, ensure_ready
from service.errors import Unavailable, error_response
from service.kserve import EXTENSIONS, HEADER_LENGTH, encode_infer_response, parse_infer_request
from service.kserve_model import check_inputs, check_outputs, model_metadata
from service.repository import LoadedModel
from service.uploads import declared_length, read_body

router = APIRouter(tags=["inference"])

# Bodies above this are parsed / encoded in a worker thread so the event loop keeps serving.
OFFLOAD_BYTES = 256 * 1024
T = TypeVar("T")
NameParam = Annotated[str, Path(description="Model name: a folder of the model repository.")]
VersionParam = Annotated[str, Path(description="Model version; every model has version '1'.")]


def engine_of(request: Request) -> Engine:
    engine: Engine | None = getattr(request.app.state, "engine", None)
    if engine is None:
        raise Unavailable("the service is starting: models are not loaded yet", retry_after=1)
    return engine


def _model(request: Request, name: NameParam) -> RepositoryEntry:
    return engine_of(request).get(name)


def _versioned_model(request: Request, name: NameParam, version: VersionParam) -> RepositoryEntry:
    return engine_of(request).get(name, version)


ModelDep = Annotated[RepositoryEntry, Depends(_model)]
VersionedModelDep = Annotated[RepositoryEntry, Depends(_versioned_model)]


async def _maybe_offload(size: int, fn: Callable[..., T], *args: Any) -> T:
    if size > OFFLOAD_BYTES:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


@router.get("/v2", summary="Server metadata")
async def server_metadata() -> dict[str, Any]:
    return {"name": "posenc", "version": __version__, "extensions": EXTENSIONS}


@router.get("/v2/health/live", summary="Server liveness")
async def server_live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready", summary="Server readiness: every model loaded and valid")
async def server_ready(request: Request) -> JSONResponse:
    problems: list[str] = list(getattr(request.app.state, "readiness_problems", ["starting"]))
    if problems:
        return error_response(503, Unavailable.error_type, "not ready: " + "; ".join(problems), ready=False)
    return JSONResponse({"ready": True})


@router.get("/v2/models/{name}", summary="Model metadata")
def model_metadata_route(model: ModelDep) -> dict[str, Any]:
    return model_metadata(model)


@router.get("/v2/models/{name}/versions/{version}", summary="Model metadata (version)")
def model_version_metadata(model: VersionedModelDep) -> dict[str, Any]:
    return model_metadata(model)


def _ready_response(model: RepositoryEntry) -> JSONResponse:
    if not model.ready:
        return error_response(503, Unavailable.error_type, str(model.problem), name=model.name, ready=False)
    return JSONResponse({"name": model.name, "versions": [VERSION], "ready": True})


@router.get("/v2/models/{name}/ready", summary="Model readiness")
def model_ready(model: ModelDep) -> JSONResponse:
    return _ready_response(model)


@router.get("/v2/models/{name}/versions/{version}/ready", summary="Model readiness (version)")
def model_version_ready(model: VersionedModelDep) -> JSONResponse:
    return _ready_response(model)


@router.get("/v2/models/{name}/stats", summary="Model statistics (rows inferred, onnxruntime executions)")
def model_stats(request: Request, model: ModelDep) -> dict[str, Any]:
    return {"model_stats": [engine_of(request).statistics(model)]}


@router.get("/v2/models/{name}/versions/{version}/stats", summary="Model statistics (version)")
def model_version_stats(request: Request, model: VersionedModelDep) -> dict[str, Any]:
    return {"model_stats": [engine_of(request).statistics(model)]}


@router.post("/v2/models/{name}/infer", summary="Inference (JSON or binary tensors)")
async def infer(request: Request, model: ModelDep) -> Response:
    return await _infer(request, model)


@router.post("/v2/models/{name}/versions/{version}/infer", summary="Inference (version)")
async def infer_version(request: Request, model: VersionedModelDep) -> Response:
    return await _infer(request, model)


async def _infer(request: Request, entry: RepositoryEntry) -> Response:
    """Admit, read, parse and validate everything, run through the model's batcher, encode the outputs."""
    model = ensure_ready(entry)  # 503 before reading a body that cannot be served
    engine = engine_of(request)
    limit = request.app.state.settings.max_request_bytes
    budget: MemoryBudget = request.app.state.memory_budget
    # held until the answer is encoded: the body, the outputs (as large as the query) and their encoding
    reserved = 3 * declared_length(request.headers.get("content-length"), limit)
    with engine.admission(model):  # a full queue refuses before the body is read
        async with budget.reserve(reserved, f"an inference on '{model.name}'"):
            return await _run_infer(request, engine, model, limit)


async def _run_infer(request: Request, engine: Engine, model: LoadedModel, limit: int) -> Response:
    body = await read_body(request.headers.get("content-length"), request.stream(), limit)
    parsed = await _maybe_offload(len(body), parse_infer_request, body, request.headers.get(HEADER_LENGTH))
    inputs = check_inputs(model, parsed.inputs)
    if parsed.outputs is not None:
        check_outputs(model, [out.name for out in parsed.outputs])
    outputs = await engine.infer(model, inputs)
    size = sum(array.nbytes for array in outputs.values())
    content, headers = await _maybe_offload(size, encode_infer_response, model.name, VERSION, parsed, outputs,
                                            model.config.output_names)
    return Response(content=content, headers=headers, media_type=None)
