"""A model as Triton describes one it serves (`model_config.proto` as JSON: `input`/`output` with `data_type`
`TYPE_FP32`… and `dims` without the batch dimension, `max_batch_size`, `dynamic_batching`, `instance_group`),
so Triton's own tools and dashboards can read posenc: `GET /v2/models/{name}/config`; and Triton's repository
index, every model with its state (`POST /v2/repository/index`). HTTP and gRPC answer both from here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.models.dtypes import BY_KSERVE
from posenc.service.inference.runtime.devices import CUDA
from posenc.service.inference.runtime.repository import VERSION, LoadedModel, LoadingModel, ModelTensor, RepositoryEntry
from posenc.service.settings import Settings


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


def repository_index(models: Mapping[str, RepositoryEntry], ready_only: bool) -> list[dict[str, str]]:
    """Every model with its state, `READY`, `LOADING` or `UNAVAILABLE` and the reason (`ready_only`: the ready ones),
    by name."""
    entries = []
    for name, model in sorted(models.items()):
        if model.ready:
            entries.append({"name": name, "version": VERSION, "state": "READY"})
        elif not ready_only:
            state = "LOADING" if isinstance(model, LoadingModel) else "UNAVAILABLE"
            entries.append({"name": name, "version": VERSION, "state": state, "reason": str(model.problem)})
    return entries
