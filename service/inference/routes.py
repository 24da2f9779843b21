"""KServe v2 / Open Inference Protocol routes (REST), served from the model repository.

`GET /v2`, `/v2/health/live`, `/v2/health/ready`, `GET /v2/models/{name}[/versions/{v}]`, `.../ready`,
`.../stats`, `POST .../infer` (answered by `posenc.service.inference.answer`: the route reads the raw body
itself, as tritonclient sends no Content-Type and binary tensors follow the JSON header,
`Inference-Header-Content-Length`); Triton's repository views (`.../config`, `POST /v2/repository/index`);
`POST /v2/models/{name}/check` (your attention output against the model's); the system shared-memory routes
(`/v2/systemsharedmemory/...`: status, register, unregister).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
import pydantic_core
from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.responses import JSONResponse, Response
from pydantic import StrictBool
from starlette.concurrency import run_in_threadpool

from posenc.models.diagnosis.attention import AttentionSpec
from posenc.service import __version__
from posenc.service.check.attention import EXPECTED, bound_attention_work, check_attention
from posenc.service.errors import BadRequest, Unavailable, error_response
from posenc.service.inference import answer
from posenc.service.inference.codecs.kserve_request import HEADER_LENGTH, InputTensor, extensions, parse_infer_request
from posenc.service.inference.model_inputs import check_inputs, model_metadata
from posenc.service.inference.runtime.repository import VERSION, RepositoryEntry, ensure_ready
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry, parse_register
from posenc.service.inference.triton_config import repository_index, triton_config
from posenc.service.request_kit.bodies import declared_length, read_body
from posenc.service.request_kit.deps import (
    EngineDep,
    MemoryBudgetDep,
    ReadinessDep,
    SettingsDep,
    SharedMemoryDep,
    engine_of,
    memory_budget_of,
    settings_of,
    shared_memory_of,
)
from posenc.service.request_kit.restricted import shared_memory_caller

router = APIRouter(tags=["inference"])
check_router = APIRouter(tags=["check"])  # beside the table checks
shared_memory_router = APIRouter(tags=["shared memory"])

NameParam = Annotated[str, Path(description="Model name: a folder of the model repository.")]
VersionParam = Annotated[str, Path(description="Model version; every model has version '1'.")]


async def _model(engine: EngineDep, name: NameParam) -> RepositoryEntry:
    return engine.get(name)


async def _versioned_model(engine: EngineDep, name: NameParam, version: VersionParam) -> RepositoryEntry:
    return engine.get(name, version)


ModelDep = Annotated[RepositoryEntry, Depends(_model)]
VersionedModelDep = Annotated[RepositoryEntry, Depends(_versioned_model)]


async def _infer_context(request: Request) -> answer.InferContext:
    # One dependency reading the four (FastAPI solves each dependency of a route on every request: on a small
    # inference that is a measurable share of the fixed cost).
    return answer.InferContext(await engine_of(request), await settings_of(request), await memory_budget_of(request),
                        await shared_memory_of(request))


InferContextDep = Annotated[answer.InferContext, Depends(_infer_context)]


@router.get("/v2", summary="Server metadata")
async def server_metadata(settings: SettingsDep) -> dict[str, Any]:
    return {"name": "posenc", "version": __version__, "extensions": extensions(settings.shared_memory)}


@router.get("/v2/health/live", summary="Server liveness")
async def server_live() -> dict[str, bool]:
    return {"live": True}


@router.get("/v2/health/ready", summary="Server readiness: every model loaded and valid")
async def server_ready(problems: ReadinessDep) -> JSONResponse:
    if problems:
        return error_response(503, Unavailable.error_type, "not ready: " + "; ".join(problems), ready=False)
    return JSONResponse({"ready": True})


@router.get("/v2/models/{name}", summary="Model metadata")
async def model_metadata_route(model: ModelDep) -> dict[str, Any]:
    return model_metadata(model)


@router.get("/v2/models/{name}/versions/{version}", summary="Model metadata (version)")
async def model_version_metadata(model: VersionedModelDep) -> dict[str, Any]:
    return model_metadata(model)


def _ready_response(model: RepositoryEntry) -> JSONResponse:
    if not model.ready:
        return error_response(503, Unavailable.error_type, str(model.problem), name=model.name, ready=False)
    return JSONResponse({"name": model.name, "versions": [VERSION], "ready": True})


@router.get("/v2/models/{name}/ready", summary="Model readiness")
async def model_ready(model: ModelDep) -> JSONResponse:
    return _ready_response(model)


@router.get("/v2/models/{name}/versions/{version}/ready", summary="Model readiness (version)")
async def model_version_ready(model: VersionedModelDep) -> JSONResponse:
    return _ready_response(model)


@router.get("/v2/models/{name}/stats", summary="Model statistics (rows inferred, onnxruntime executions)")
async def model_stats(engine: EngineDep, model: ModelDep) -> dict[str, Any]:
    return {"model_stats": [engine.statistics(model)]}


@router.get("/v2/models/{name}/versions/{version}/stats", summary="Model statistics (version)")
async def model_version_stats(engine: EngineDep, model: VersionedModelDep) -> dict[str, Any]:
    return {"model_stats": [engine.statistics(model)]}


@router.post("/v2/models/{name}/infer", summary="Inference (JSON or binary tensors)")
async def infer(request: Request, name: NameParam, context: InferContextDep) -> Response:
    return await answer.infer(request, context.engine.get(name), context)


@router.post("/v2/models/{name}/versions/{version}/infer", summary="Inference (version)")
async def infer_version(request: Request, name: NameParam, version: VersionParam,
                        context: InferContextDep) -> Response:
    return await answer.infer(request, context.engine.get(name, version), context)


# Triton's model-repository views

@router.get("/v2/models/{name}/config", summary="Model configuration (Triton's model_config as JSON)")
async def model_config(model: ModelDep, settings: SettingsDep) -> dict[str, Any]:
    return triton_config(ensure_ready(model), settings)


@router.get("/v2/models/{name}/versions/{version}/config", summary="Model configuration (version)")
async def model_version_config(model: VersionedModelDep, settings: SettingsDep) -> dict[str, Any]:
    return triton_config(ensure_ready(model), settings)


@router.post("/v2/repository/index", summary="Every model of the repository and its state (Triton's index)")
def repository_index_route(
    engine: EngineDep,
    ready: Annotated[StrictBool, Body(embed=True, description="Only the models that are ready to serve.")] = False,
) -> list[dict[str, str]]:
    return repository_index(engine.models, ready)


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


def split_expected(tensors: Sequence[InputTensor]) -> tuple[list[InputTensor], np.ndarray]:
    """The model's inputs, and the user's output (400 when it is missing)."""
    expected = [t for t in tensors if t.name == EXPECTED]
    if len(expected) != 1:
        raise BadRequest(f"add your output as the input tensor '{EXPECTED}' (same shape and datatype as the model's "
                         "output), once")
    return [t for t in tensors if t.name != EXPECTED], expected[0].array


@check_router.post("/v2/models/{name}/check", summary="Check your attention output against the model's",
             openapi_extra=BODY_DOC, response_class=JSONResponse)
async def check_model(request: Request,
                      name: Annotated[str, Path(description="Model name: a folder of the model repository.")],
                      engine: EngineDep, settings: SettingsDep, budget: MemoryBudgetDep) -> JSONResponse:
    """Runs the infer request through the model and compares your `expected_output` with its output; the
    diagnosis ranks missing causal mask, 1/D scale, GQA grouping, RoPE on v and positions not passed."""
    model = ensure_ready(engine.get(name))
    limit = settings.max_request_bytes
    what = f"a check on '{model.name}'"
    with engine.admission(model):
        # the body, its decoded tensors and the output, then the run inside onnxruntime (the attention scores)
        reservation = await budget.acquire(3 * declared_length(request.headers.get("content-length"), limit), what)
        try:
            body = await read_body(request.headers.get("content-length"), request.stream(), limit)
            parsed = await answer.parse_watched(request, len(body), parse_infer_request, body,
                                                request.headers.get(HEADER_LENGTH))
            tensors, expected = split_expected(parsed.inputs)
            inputs = check_inputs(model, tensors)
            bound_attention_work(AttentionSpec.from_config(model.config.raw), inputs, settings.max_table_bytes)
            await reservation.grow(3 * len(body) + engine.run_memory(model, inputs), what)
            outputs = await engine.infer(model, inputs)
            output = outputs[model.config.output_names[0]]
            report = await run_in_threadpool(check_attention, model.name, model.config.raw, inputs, output, expected)
        finally:
            reservation.release()
    return JSONResponse(report.document())


# System shared memory (on when POSENC_SHARED_MEMORY=true, else each answers 400); the registry is
# posenc.service.inference.shared_memory.registry. Register and unregister answer an empty 200, as Triton does. Each
# caller sees and changes only its own regions (its uid on the Unix socket; the key's holders over TCP).

REGISTER_BODY_LIMIT = 64 * 1024
RegionParam = Annotated[str, Path(description="Name the region is registered under.")]


async def _enabled_registry(request: Request, registry: SharedMemoryDep) -> SharedMemoryRegistry:
    """The registry, or 400 saying how to turn the extension on; 403 for a caller that may not use shared
    memory at all (over TCP without the shared-memory key)."""
    registry.require_enabled()
    shared_memory_caller(request.scope).require(request.url.path)
    return registry


EnabledRegistryDep = Annotated[SharedMemoryRegistry, Depends(_enabled_registry)]


@shared_memory_router.get("/v2/systemsharedmemory/status",
                          summary="Status of every registered system shared-memory region")
def status_all(request: Request, registry: EnabledRegistryDep) -> list[dict[str, Any]]:
    return registry.status(shared_memory_caller(request.scope))


@shared_memory_router.get("/v2/systemsharedmemory/region/{name}/status",
                          summary="Status of one system shared-memory region")
def status_one(request: Request, registry: EnabledRegistryDep, name: RegionParam) -> list[dict[str, Any]]:
    return registry.status(shared_memory_caller(request.scope), name)


@shared_memory_router.post("/v2/systemsharedmemory/region/{name}/register",
                           summary="Register a system shared-memory region")
async def register(request: Request, registry: EnabledRegistryDep, name: RegionParam) -> Response:
    body = await read_body(request.headers.get("content-length"), request.stream(), REGISTER_BODY_LIMIT)
    try:
        parsed = pydantic_core.from_json(body)
    except ValueError as exc:
        raise BadRequest(f"register: the body is not valid JSON: {exc}") from None
    registry.register(name, *parse_register(parsed), caller=shared_memory_caller(request.scope))
    return Response(status_code=200)


@shared_memory_router.post("/v2/systemsharedmemory/region/{name}/unregister",
                           summary="Unregister a system shared-memory region")
def unregister(request: Request, registry: EnabledRegistryDep, name: RegionParam) -> Response:
    registry.unregister(shared_memory_caller(request.scope), name)
    return Response(status_code=200)


@shared_memory_router.post("/v2/systemsharedmemory/unregister",
                           summary="Unregister every system shared-memory region")
def unregister_all(request: Request, registry: EnabledRegistryDep) -> Response:
    registry.unregister(shared_memory_caller(request.scope))
    return Response(status_code=200)
