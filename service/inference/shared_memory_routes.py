"""Triton / KServe v2 system shared-memory routes (on when POSENC_SHARED_MEMORY=true, else each answers 400).

`GET /v2/systemsharedmemory/status`, `GET /v2/systemsharedmemory/region/{name}/status` (a JSON list of
`{"name", "key", "offset", "byte_size"}`), `POST .../region/{name}/register` (JSON body `key`, `offset`,
`byte_size`), `POST .../region/{name}/unregister`, `POST /v2/systemsharedmemory/unregister` (every region).
Register and unregister answer an empty 200, as Triton does. Each caller sees and changes only its own
regions (its uid on the Unix socket; the shared-memory key's holders over TCP). The registry is
`posenc.service.inference.shared_memory`.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic_core
from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response

from posenc.service.errors import BadRequest
from posenc.service.http.bodies import read_body
from posenc.service.http.deps import SharedMemoryDep
from posenc.service.http.restricted import shared_memory_caller
from posenc.service.inference.shared_memory import SharedMemoryRegistry, parse_register

router = APIRouter(tags=["shared memory"])

REGISTER_BODY_LIMIT = 64 * 1024
RegionParam = Annotated[str, Path(description="Name the region is registered under.")]


async def _enabled_registry(request: Request, registry: SharedMemoryDep) -> SharedMemoryRegistry:
    """The registry, or 400 saying how to turn the extension on; 403 for a caller that may not use shared
    memory at all (over TCP without the shared-memory key)."""
    registry.require_enabled()
    shared_memory_caller(request.scope).require(request.url.path)
    return registry


EnabledRegistryDep = Annotated[SharedMemoryRegistry, Depends(_enabled_registry)]


@router.get("/v2/systemsharedmemory/status", summary="Status of every registered system shared-memory region")
def status_all(request: Request, registry: EnabledRegistryDep) -> list[dict[str, Any]]:
    return registry.status(shared_memory_caller(request.scope))


@router.get("/v2/systemsharedmemory/region/{name}/status", summary="Status of one system shared-memory region")
def status_one(request: Request, registry: EnabledRegistryDep, name: RegionParam) -> list[dict[str, Any]]:
    return registry.status(shared_memory_caller(request.scope), name)


@router.post("/v2/systemsharedmemory/region/{name}/register", summary="Register a system shared-memory region")
async def register(request: Request, registry: EnabledRegistryDep, name: RegionParam) -> Response:
    body = await read_body(request.headers.get("content-length"), request.stream(), REGISTER_BODY_LIMIT)
    try:
        parsed = pydantic_core.from_json(body)
    except ValueError as exc:
        raise BadRequest(f"register: the body is not valid JSON: {exc}") from None
    registry.register(name, *parse_register(parsed), caller=shared_memory_caller(request.scope))
    return Response(status_code=200)


@router.post("/v2/systemsharedmemory/region/{name}/unregister", summary="Unregister a system shared-memory region")
def unregister(request: Request, registry: EnabledRegistryDep, name: RegionParam) -> Response:
    registry.unregister(shared_memory_caller(request.scope), name)
    return Response(status_code=200)


@router.post("/v2/systemsharedmemory/unregister", summary="Unregister every system shared-memory region")
def unregister_all(request: Request, registry: EnabledRegistryDep) -> Response:
    registry.unregister(shared_memory_caller(request.scope))
    return Response(status_code=200)
