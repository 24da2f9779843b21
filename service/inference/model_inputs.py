"""The KServe v2 view of a repository model: its metadata document and the checks of a request's
tensors against its config.json (every mismatch a 400 naming the tensor).

Beside `posenc.service.inference.codecs.kserve_request` (the wire codec); the engine knows neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from posenc.service.errors import BadRequest, listed
from posenc.service.inference.codecs.kserve_request import InputTensor
from posenc.service.inference.runtime.repository import VERSION, FailedModel, LoadedModel, ModelTensor, RepositoryEntry


def model_metadata(model: RepositoryEntry) -> dict[str, Any]:
    """KServe model metadata (+ readiness, providers, max_batch_size and the rope configuration)."""
    meta: dict[str, Any] = {"name": model.name, "versions": [VERSION], "platform": "onnxruntime_onnx",
                            "ready": model.ready, "providers": list(model.providers)}
    if isinstance(model, FailedModel):
        return {**meta, "inputs": [], "outputs": [], "problem": model.problem}
    config = model.config
    raw = config.raw
    meta.update(inputs=[t.as_json() for t in config.inputs], outputs=[t.as_json() for t in config.outputs],
                parameters={"max_batch_size": config.max_batch_size, "causal": config.causal,
                            "max_position": config.max_position, "opset": raw.get("opset"),
                            "attention": raw.get("attention"), "rope": raw.get("rope"), "sha256": config.sha256})
    return meta


def check_inputs(model: LoadedModel, tensors: Sequence[InputTensor]) -> dict[str, np.ndarray]:
    """Request tensors checked against config.json → the model's inputs by name, in model order."""
    config = model.config
    given = {t.name: t for t in tensors}
    expected = [t.name for t in config.inputs]
    missing = [name for name in expected if name not in given]
    unknown = [name for name in given if name not in expected]
    if unknown:
        raise BadRequest(f"unknown input(s) {listed(unknown)}; model '{model.name}' takes {expected}")
    if missing:
        raise BadRequest(f"missing input(s) {missing}; model '{model.name}' takes {expected}")
    _check_heads(given)
    for declared in config.inputs:
        _check_tensor(declared, given[declared.name])
    _check_shared_dims(config.inputs, given)
    if config.max_position is not None and "position_ids" in given:
        _check_positions(given["position_ids"].array, config.max_position)
    return {t.name: given[t.name].array for t in config.inputs}


def check_outputs(model: LoadedModel, names: Sequence[str]) -> None:
    known = model.config.output_names
    unknown = [name for name in names if name not in known]
    if unknown:
        raise BadRequest(f"unknown output(s) {listed(unknown)}; model '{model.name}' returns {known}")


def _check_heads(given: Mapping[str, InputTensor]) -> None:
    """GQA/MQA need Hq a multiple of Hkv, and key and value must agree (checked before exact dims)."""
    query, key, value = given.get("query"), given.get("key"), given.get("value")
    if query is None or key is None or len(query.shape) != 4 or len(key.shape) != 4:
        return
    hq, hkv = query.shape[1], key.shape[1]
    if hkv == 0 or hq % hkv:
        raise BadRequest(f"query has {hq} heads and key {hkv}: Hq must be a multiple of Hkv")
    if value is not None and value.shape != key.shape:
        raise BadRequest(f"key {list(key.shape)} and value {list(value.shape)} must have the same shape")


def _check_tensor(declared: ModelTensor, tensor: InputTensor) -> None:
    where = f"input '{declared.name}'"
    if tensor.datatype != declared.datatype:
        raise BadRequest(f"{where}: datatype {tensor.datatype}, the model expects {declared.datatype}")
    if len(tensor.shape) != len(declared.shape):
        raise BadRequest(f"{where}: shape {list(tensor.shape)} has rank {len(tensor.shape)}, "
                         f"the model expects {list(declared.shape)} (-1 = any)")
    for axis, (got, want) in enumerate(zip(tensor.shape, declared.shape, strict=True)):
        if want != -1 and got != want:
            raise BadRequest(f"{where}: shape {list(tensor.shape)} does not match {list(declared.shape)} "
                             f"(dim {axis} must be {want})")
        if want == -1 and got < 1:
            raise BadRequest(f"{where}: shape {list(tensor.shape)}: dynamic dim {axis} must be >= 1")


def _check_shared_dims(declared: Sequence[ModelTensor], given: Mapping[str, InputTensor]) -> None:
    """All inputs share the batch size, and the sequence length where they have one."""
    batch = {t.name: given[t.name].shape[0] for t in declared}
    if len(set(batch.values())) > 1:
        raise BadRequest(f"inputs disagree on the batch size (dim 0): {batch}")
    seq = {t.name: given[t.name].shape[axis] for t in declared if (axis := t.sequence_axis()) is not None}
    if len(set(seq.values())) > 1:
        raise BadRequest(f"inputs disagree on the sequence length: {seq}")


def _check_positions(positions: np.ndarray, max_position: int) -> None:
    if positions.size == 0 or (positions.min() >= 0 and positions.max() < max_position):
        return  # two reductions, no temporaries: the common case
    bad = (positions < 0) | (positions >= max_position)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise BadRequest(f"input 'position_ids': values must be in [0, {max_position}); "
                         f"found {int(positions[where])} at index {list(where)}")
