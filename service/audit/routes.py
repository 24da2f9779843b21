"""`POST /v1/audit`: a GGUF, ONNX, safetensors or config.json file (or `posenc audit --remote`'s extract) audited
for its position handling. GGUF and safetensors bodies stream: the header is read, then only the few tensors
that carry position facts; the rest of the body is never held. The rest are read whole within
POSENC_AUDIT_MAX_ONNX_BYTES."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from posenc.service.audit.report import picture
from posenc.service.audit.run import parse_config, read_upload, run
from posenc.service.errors import BadRequest, ClientClosedRequest
from posenc.service.request_kit.deps import MemoryBudgetDep, SettingsDep, ThreadKindsDep
from posenc.service.request_kit.threads import AUDIT_WORK

router = APIRouter(tags=["audit"])
BODY = {"requestBody": {"required": True, "content": {"application/octet-stream": {"schema": {
    "type": "string", "format": "binary",
    "description": "The artifact: a GGUF file, an ONNX model, a safetensors checkpoint, a config.json, or the "
                   "extract `posenc audit --remote` sends."}}}}}


@router.post("/v1/audit", summary="Audit a GGUF, ONNX, safetensors or config.json file's position handling",
             openapi_extra=BODY, response_class=JSONResponse)
async def audit_route(
    request: Request, settings: SettingsDep, budget: MemoryBudgetDep, kinds: ThreadKindsDep,
    preset: Annotated[str | None, Query(description="Reference: a catalogue preset (GET /v1/presets); default: "
                                                    "the presets matching the file's architecture and sizes.",
                                        max_length=200)] = None,
    config: Annotated[str | None, Query(description="Reference: a config.json, URL-encoded (instead of a preset; "
                                                    "the request head's bound, POSENC_MAX_HEADER_BYTES, holds it).")]
    = None,
    layer_type: Annotated[str | None, Query(description="For a model with RoPE per layer type (Gemma's "
                                                       "full_attention / sliding_attention): judge that layer type "
                                                       "alone. Not given: every layer type, the verdict the worst of "
                                                       "them.", max_length=128)] = None,
    format: Annotated[Literal["json", "png"], Query(description="json (default): facts, verdicts, tables; png: "
                                                              "the divergence.")] = "json",
) -> Response:
    # every step off the event loop runs on the audits' own threads: however many audits come, the other
    # requests' threads stay theirs
    in_thread = partial(kinds.run, AUDIT_WORK)
    reference_config = await in_thread(parse_config, config)  # counted, then parsed off the event loop
    length = request.headers.get("content-length")
    size = int(length) if length is not None and length.isascii() and length.isdigit() and len(length) < 19 \
        else None
    if size == 0:
        raise BadRequest("the body is empty: send the file to audit")
    held = 2 * min(size or settings.audit_max_onnx_bytes, max(settings.audit_max_header_bytes,
                                                              settings.audit_max_onnx_bytes))
    async with budget.reserve(held, "an audit"):
        try:
            found = await read_upload(request.stream().__aiter__(), size, settings, in_thread)
        except ClientDisconnect:
            raise ClientClosedRequest("the client disconnected during the upload") from None
        result = await in_thread(run, found, preset, reference_config, layer_type)
    if format == "png":
        return Response(await in_thread(picture, result, "upload"), media_type="image/png")
    return JSONResponse(result.document())
