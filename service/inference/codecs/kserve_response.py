"""KServe v2 / Open Inference Protocol: the infer response, as a JSON header and the binary outputs.

Outputs are sent binary when the request says so (`parameters.binary_data_output` for all, or
`outputs[i].parameters.binary_data`), as a JSON `data` list otherwise, and as metadata only when they
went to shared memory. The request side (its types and the parser) is `posenc.service.inference.codecs.kserve_request`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pydantic_core

from posenc.models.dtypes import lookup
from posenc.service.inference.codecs.kserve_json import placeholder, splice
from posenc.service.inference.codecs.kserve_request import HEADER_LENGTH, InferRequest, RequestedOutput


def encode_infer_response(
    model_name: str, model_version: str, request: InferRequest, outputs: Mapping[str, np.ndarray],
    order: Sequence[str],
) -> tuple[bytes, dict[str, str]]:
    """Response body and headers. `order`: the model's output names (used when none were requested)."""
    parts, headers = encode_infer_response_parts(model_name, model_version, request, outputs, order)
    del headers["Content-Length"]  # a Response of one joined body sets its own
    return b"".join(parts), headers


def requested_outputs(request: InferRequest, order: Sequence[str]) -> list[RequestedOutput]:
    """The outputs to answer: those requested, else every model output in `order`."""
    if request.outputs is not None:
        return request.outputs
    return [RequestedOutput(name, request.binary_output) for name in order]


def encode_infer_response_parts(
    model_name: str, model_version: str, request: InferRequest, outputs: Mapping[str, np.ndarray],
    order: Sequence[str],
) -> tuple[list[bytes | bytearray | memoryview], dict[str, str]]:
    """The response body as parts to send one after the other (the JSON header, then each binary output
    as a view of its array: nothing is joined), and the headers, Content-Length included.

    Outputs sent through shared memory (already written there) are listed with their parameters only.
    """
    entries: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    lists: dict[str, np.ndarray] = {}  # placeholder in the header -> the array whose data list goes there
    nonce = os.urandom(8).hex()
    for out in requested_outputs(request, order):
        array = np.ascontiguousarray(outputs[out.name])
        entry: dict[str, Any] = {"name": out.name, "datatype": lookup(array.dtype).kserve, "shape": list(array.shape)}
        if out.shm is not None:
            entry["parameters"] = out.shm.parameters(array.nbytes)
        elif out.binary:
            entry["parameters"] = {"binary_data_size": array.nbytes}
            chunks.append(array.reshape(-1).view(np.uint8).data)  # [nbytes], no copy
        else:
            # [N] row-major flat list, as the protocol sends; non-finite floats as the tables spell them
            # ("NaN", "Infinity", "-Infinity"): a bare NaN is not JSON and JSON.parse rejects it
            # (written by `splice`, a chunk at a time: no Python object per number for the whole output)
            token = placeholder(len(lists), nonce)
            lists[token] = array
            entry["data"] = token
        entries.append(entry)
    head: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        head["id"] = request.id
    head["outputs"] = entries
    header = splice(pydantic_core.to_json(head), lists)
    header_size = sum(len(part) for part in header)
    size = header_size + sum(len(chunk) for chunk in chunks)
    if not chunks:
        return [*header], {"Content-Type": "application/json", "Content-Length": str(size)}
    headers = {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_size), "Content-Length": str(size)}
    return [*header, *chunks], headers
