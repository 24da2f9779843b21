"""Triton's model-repository views, so Triton's own tools and dashboards can read posenc.

`GET /v2/models/{name}[/versions/{v}]/config`: the model's configuration in Triton's JSON form
(`model_config.proto`: `input`/`output` with `data_type` `TYPE_FP32`… and `dims` without the batch
dimension, `max_batch_size`, `dynamic_batching`, `instance_group`). `POST /v2/repository/index`: every
model with its state (`READY`, or `UNAVAILABLE` and the reason).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import StrictBool

from posenc.models.dtypes import BY_KSERVE
from posenc.service.inference.devices import CUDA
from posenc.service.inference.repository import VERSION, LoadedModel, ModelTensor, ensure_ready
from posenc.service.inference.routes import ModelDep, VersionedModelDep
from posenc.service.request_kit.deps import EngineDep, SettingsDep
from posenc.service.settings import Settings

router = APIRouter(tags=["inference"])


def _tensor_config(tensor: ModelTensor) -> dict[str, Any]:
    return {"name": tensor.name, "data_type": BY_KSERVE[tensor.datatype].triton, "dims": list(tensor.shape[1:])}


def triton_config(model: LoadedModel, settings: Settings) -> dict[str, Any]:
    """The model as Triton describes a model it serves (the fields Triton's tools read)."""
    config = model.config
    on_gpu = CUDA in model.providers
    document: dict[str, Any] = {
        "name": model.name, "platform": "onnxruntime_onnx", "backend": "onnxruntime",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": settings.max_batch_size or config.max_batch_size,
        "input": [_tensor_config(t) for t in config.inputs],
        "output": [_tensor_config(t) for t in config.outputs],
        "instance_group": [{"name": model.name, "kind": "KIND_GPU" if on_gpu else "KIND_CPU", "count": 1,
                            "gpus": [0] if on_gpu else []}],
        "default_model_filename": "model.onnx",
    }
    if settings.batching:
        document["dynamic_batching"] = {
            "preferred_batch_size": [], "max_queue_delay_microseconds": settings.max_queue_delay_us,
            "preserve_ordering": False, "default_queue_policy": {"max_queue_size": settings.max_queue_size},
        }
    return document


@router.get("/v2/models/{name}/config", summary="Model configuration (Triton's model_config as JSON)")
async def model_config(model: ModelDep, settings: SettingsDep) -> dict[str, Any]:
    return triton_config(ensure_ready(model), settings)


@router.get("/v2/models/{name}/versions/{version}/config", summary="Model configuration (version)")
async def model_version_config(model: VersionedModelDep, settings: SettingsDep) -> dict[str, Any]:
    return triton_config(ensure_ready(model), settings)


@router.post("/v2/repository/index", summary="Every model of the repository and its state (Triton's index)")
def repository_index(
    engine: EngineDep,
    ready: Annotated[StrictBool, Body(embed=True, description="Only the models that are ready to serve.")] = False,
) -> list[dict[str, str]]:
    entries = []
    for name, model in sorted(engine.models.items()):
        if model.ready:
            entries.append({"name": name, "version": VERSION, "state": "READY"})
        elif not ready:
            entries.append({"name": name, "version": VERSION, "state": "UNAVAILABLE", "reason": str(model.problem)})
    return entries
