"""`POST /v2/models/{name}/check`: an infer request plus your output (`expected_output`), answered with the
agreement of your output with the model's and the attention mistakes that explain a difference."""

from collections.abc import Sequence
from typing import Annotated

import numpy as np
from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from posenc.models.diagnosis.attention import AttentionSpec
from posenc.service.check.attention import EXPECTED, bound_attention_work, check_attention
from posenc.service.errors import BadRequest
from posenc.service.http.bodies import declared_length, read_body
from posenc.service.http.deps import EngineDep, MemoryBudgetDep, SettingsDep
from posenc.service.inference.kserve import HEADER_LENGTH, InputTensor, parse_infer_request
from posenc.service.inference.model_inputs import check_inputs
from posenc.service.inference.repository import ensure_ready
from posenc.service.inference.routes import parse_watched

router = APIRouter(tags=["check"])

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


@router.post("/v2/models/{name}/check", summary="Check your attention output against the model's",
             openapi_extra=BODY_DOC, response_class=JSONResponse)
async def check_model(request: Request,
                      name: Annotated[str, Path(description="Model name: a folder of the model repository.")],
                      engine: EngineDep, settings: SettingsDep, budget: MemoryBudgetDep) -> JSONResponse:
    """Runs the infer request through the model and compares your `expected_output` with its output; the
    diagnosis ranks missing causal mask, 1/D scale, GQA grouping, RoPE on v and positions not passed."""
    model = ensure_ready(engine.get(name))
    limit = settings.max_request_bytes
    with engine.admission(model):
        async with budget.reserve(3 * declared_length(request.headers.get("content-length"), limit),
                                  f"a check on '{model.name}'"):
            body = await read_body(request.headers.get("content-length"), request.stream(), limit)
            parsed = await parse_watched(request, len(body), parse_infer_request, body,
                                         request.headers.get(HEADER_LENGTH))
            tensors, expected = split_expected(parsed.inputs)
            inputs = check_inputs(model, tensors)
            bound_attention_work(AttentionSpec.from_config(model.config.raw), inputs, settings.max_table_bytes)
            outputs = await engine.infer(model, inputs)
            output = outputs[model.config.output_names[0]]
            report = await run_in_threadpool(check_attention, model.name, model.config.raw, inputs, output, expected)
    return JSONResponse(report.document())
