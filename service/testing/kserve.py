"""KServe v2 infer requests and responses as a client writes and reads them, JSON and binary.

The binary tensor extension: the body is `<JSON header><raw tensor bytes...>`, the header's length in
`Inference-Header-Content-Length`, each binary tensor's size in `parameters.binary_data_size`, bytes in
input order, little-endian, C order. Datatype names come from models/dtypes.py. This is the client side,
written apart from the service's codec (service/inference/codecs/kserve_request.py), so that tests check one against
the other.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posenc.models.dtypes import BY_KSERVE, lookup

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class SharedMemory:
    """`byte_size` bytes at `offset` of the registered system shared-memory region `region` (offset None: not
    sent, the server reads 0)."""

    region: str
    byte_size: int
    offset: int | None = None

    def parameters(self) -> dict[str, Any]:
        params: dict[str, Any] = {"shared_memory_region": self.region, "shared_memory_byte_size": self.byte_size}
        if self.offset is not None:
            params["shared_memory_offset"] = self.offset
        return params


@dataclass(frozen=True)
class SharedMemoryInput:
    """An input whose bytes are in a region: its datatype and shape, and where."""

    dtype: np.dtype
    shape: tuple[int, ...]
    place: SharedMemory


@dataclass(frozen=True)
class RequestedOutput:
    """An entry of `outputs`: binary or JSON (None: not said), or written into shared memory."""

    name: str
    binary: bool | None = None
    shared_memory: SharedMemory | None = None

    def entry(self) -> dict[str, Any]:
        params: dict[str, Any] = {} if self.binary is None else {"binary_data": self.binary}
        if self.shared_memory is not None:
            params.update(self.shared_memory.parameters())
        return {"name": self.name, "parameters": params} if params else {"name": self.name}


@dataclass(frozen=True)
class KServeRequest:
    """What to POST to `/v2/models/<model>/infer`: the body, its headers, and its JSON header as a dict."""

    body: bytes
    headers: dict[str, str]
    header: dict[str, Any]
    header_length: int | None  # None: a JSON body


def little_endian_bytes(array: np.ndarray) -> bytes:
    """The array's elements, C order, little-endian: a binary tensor's bytes."""
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def shared_memory_inputs(arrays: Mapping[str, np.ndarray], region: str) -> dict[str, SharedMemoryInput]:
    """`arrays` laid out back to back (in order) from the start of `region`, as request inputs."""
    out, offset = {}, 0
    for name, array in arrays.items():
        out[name] = SharedMemoryInput(array.dtype, array.shape, SharedMemory(region, array.nbytes, offset))
        offset += array.nbytes
    return out


def _input_entry(name: str, value: np.ndarray | SharedMemoryInput, binary: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "datatype": lookup(np.dtype(value.dtype)).kserve,
                             "shape": list(value.shape)}
    if isinstance(value, SharedMemoryInput):
        entry["parameters"] = value.place.parameters()
    elif binary:
        entry["parameters"] = {"binary_data_size": value.nbytes}
    else:
        entry["data"] = value.ravel().tolist()
    return entry


def kserve_request(inputs: Mapping[str, np.ndarray | SharedMemoryInput], *, binary: bool = True,
                   outputs: Sequence[str | RequestedOutput] | None = None, binary_output: bool | None = None,
                   request_id: str | None = None, parameters: Mapping[str, Any] | None = None,
                   extra: Mapping[str, Any] | None = None, content_type: bool = False) -> KServeRequest:
    """An infer request for `inputs` (numpy arrays, sent binary or as JSON `data`; or shared-memory inputs).

    outputs: the `outputs` list (names or RequestedOutput; None: not sent, the model's outputs come back);
    binary_output: the request-wide `parameters.binary_data_output`; parameters: more request parameters;
    extra: more top-level header fields, written as given (requests a test means to be odd);
    content_type: also send Content-Type (application/octet-stream for binary, else application/json).
    """
    header: dict[str, Any] = {} if request_id is None else {"id": request_id}
    header["inputs"] = [_input_entry(name, value, binary) for name, value in inputs.items()]
    if outputs is not None:
        header["outputs"] = [(RequestedOutput(o) if isinstance(o, str) else o).entry() for o in outputs]
    params = dict(parameters or {})
    if binary_output is not None:
        params["binary_data_output"] = binary_output
    if params:
        header["parameters"] = params
    header.update(extra or {})
    return request_with_header(header, [v for v in inputs.values() if isinstance(v, np.ndarray)] if binary else [],
                               content_type=content_type)


def request_with_header(header: Mapping[str, Any], arrays: Sequence[np.ndarray] = (), *,
                        content_type: bool = False) -> KServeRequest:
    """The request for a header written by hand (with `arrays` as its binary section, in order; none: JSON)."""
    head = json.dumps(header).encode()
    headers = {"Content-Type": "application/octet-stream" if arrays else "application/json"} if content_type else {}
    if not arrays:
        return KServeRequest(head, headers, dict(header), None)
    headers[HEADER_LENGTH] = str(len(head))
    return KServeRequest(head + b"".join(little_endian_bytes(a) for a in arrays), headers, dict(header), len(head))


@dataclass(frozen=True)
class KServeResponse:
    """A decoded infer response: its JSON header, and the outputs that carry data (binary or JSON), in header
    order (outputs written into shared memory carry none: their entries are in `header`)."""

    header: dict[str, Any]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)


def decode_response(body: bytes, headers: Mapping[str, str]) -> KServeResponse:
    """Decode a response body; ValueError when the binary sections do not add up to the body."""
    lowered = {k.lower(): v for k, v in headers.items()}
    length = int(lowered.get(HEADER_LENGTH.lower(), len(body)))
    header = json.loads(body[:length])
    outputs, offset = {}, length
    for entry in header.get("outputs", []):
        dtype, params = BY_KSERVE[entry["datatype"]].numpy.newbyteorder("<"), entry.get("parameters", {})
        if "binary_data_size" in params:
            size = int(params["binary_data_size"])
            if offset + size > len(body):
                raise ValueError(f"output {entry['name']!r}: {size} bytes at {offset} pass the end of the body")
            outputs[entry["name"]] = np.frombuffer(body, dtype, size // dtype.itemsize, offset).reshape(entry["shape"])
            offset += size
        elif "data" in entry:
            outputs[entry["name"]] = np.asarray(entry["data"], dtype=dtype).reshape(entry["shape"])
    if offset != len(body):
        raise ValueError(f"the binary outputs end at byte {offset}, the body has {len(body)}")
    return KServeResponse(header, outputs)
