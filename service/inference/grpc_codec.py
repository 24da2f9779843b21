"""The KServe v2 gRPC messages (`inference.GRPCInferenceService`, as Triton extends it) to and from the service's
own request and response types.

The messages are the ones `tritonclient` ships, generated from Triton's `grpc_service.proto` and
`model_config.proto` (BSD-3-Clause, github.com/triton-inference-server/common): posenc keeps no copy of them.

An infer request is turned into the JSON header's form of the HTTP protocol and parsed by the same parser
(`posenc.service.inference.kserve_request.parse_infer_document`), so both protocols apply one set of rules with one set
of messages. What only gRPC has is checked here: `raw_input_contents` (one entry per input outside shared
memory, in input order, its length that of the tensor) and typed `contents` (the field of the datatype, as
Triton reads it; FP16 and BF16 travel as raw bytes only). Outputs are always answered in `raw_output_contents`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from posenc.models.dtypes import BY_KSERVE, lookup
from posenc.service.errors import BadRequest
from posenc.service.inference.kserve_request import InferRequest, TensorSource, parse_infer_document
from posenc.service.inference.kserve_response import requested_outputs
from posenc.service.request_kit.bodies import ALIGNMENT

pb = service_pb2
Proto = Any  # a generated message (the generated modules have no type information)
SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")

# Triton's rule: the typed field each datatype's `contents` use (FP16 and BF16 have none: raw bytes only).
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
}
ALL_CONTENTS_FIELDS = (*sorted(set(CONTENTS_FIELD.values())), "bytes_contents")


def parameter_value(parameter: Proto) -> Any:
    """The value an `InferParameter` holds (None when none of its fields is set)."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def _parameters(params: Mapping[str, Proto]) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in params.items()}


def _typed_data(tensor: Proto, where: str) -> list[Any]:
    """The tensor's typed `contents` as a flat list (what the HTTP protocol's `data` holds)."""
    used = [field for field in ALL_CONTENTS_FIELDS if len(getattr(tensor.contents, field))]
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        if tensor.datatype in BY_KSERVE:
            raise BadRequest(f"{where}: datatype {tensor.datatype} has no typed contents; send its bytes in "
                             "raw_input_contents")
        return []  # the parser names the unsupported datatype
    wrong = [name for name in used if name != field]
    if wrong:
        raise BadRequest(f"{where}: datatype {tensor.datatype} takes its contents in {field} (got {', '.join(wrong)})")
    return list(getattr(tensor.contents, field))


def _raw_size_check(chunk: bytes | memoryview, tensor: Proto, index: int, where: str) -> None:
    dtype = BY_KSERVE.get(tensor.datatype)
    if dtype is None or any(d < 0 for d in tensor.shape):
        return  # the parser names the datatype or the shape
    expected = math.prod(tensor.shape) * dtype.numpy.itemsize
    if len(chunk) != expected:
        raise BadRequest(f"{where}: raw_input_contents[{index}] is {len(chunk)} bytes, shape {list(tensor.shape)} "
                         f"{tensor.datatype} needs {expected}")


RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents: repeated bytes
LENGTH_DELIMITED = 2


def _read_varint(data: memoryview, position: int) -> tuple[int, int]:
    """The varint at `position` and the position after it (IndexError past the end, ValueError when too long)."""
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def split_infer_request(data: bytes) -> tuple[Proto, list[memoryview]]:
    """A serialized `ModelInferRequest` as the message without its `raw_input_contents` and those entries as views
    of `data`, in order: protobuf would copy each entry into the message, then again into a new bytes object at
    every access (upb), where here the raw bytes are copied once, into the aligned buffer (`aligned_join`).

    Only the top-level fields are walked; the rest is parsed by protobuf, so its rules and errors are protobuf's.
    Anything the walk does not follow (a field that is not varint, fixed or length-delimited, a truncated field)
    is left to protobuf on the whole message (DecodeError where malformed)."""
    view = memoryview(data).cast("B")
    end = len(view)
    rest: list[memoryview] = []  # the other fields' bytes, in order
    raw: list[memoryview] = []
    position = 0
    try:
        while position < end:
            start = position
            key, position = _read_varint(view, position)
            wire = key & 7
            if wire == 0:
                position = _read_varint(view, position)[1]
            elif wire == 1:
                position += 8
            elif wire == 5:
                position += 4
            elif wire == LENGTH_DELIMITED:
                length, position = _read_varint(view, position)
                if key >> 3 == RAW_INPUT_FIELD:
                    if position + length > end:
                        raise ValueError("truncated field")
                    raw.append(view[position:position + length])
                    position += length
                    continue
                position += length
            else:
                raise ValueError(f"wire type {wire}")
            if position > end:
                raise ValueError("truncated field")
            rest.append(view[start:position])
    except (IndexError, ValueError):
        message = service_pb2.ModelInferRequest.FromString(data)  # DecodeError where malformed
        return message, list(message.raw_input_contents)
    return service_pb2.ModelInferRequest.FromString(b"".join(rest)), raw


def infer_document(request: Proto, raw: Sequence[bytes | memoryview] | None = None
                   ) -> tuple[dict[str, Any], list[bytes | memoryview]]:
    """The request as the HTTP protocol's JSON header, and its raw inputs in input order (400 where gRPC's own
    rules are broken). `raw`: the request's `raw_input_contents` where read apart (`split_infer_request`)."""
    raw = list(request.raw_input_contents) if raw is None else list(raw)  # (upb copies an entry at each access)
    entries: list[dict[str, Any]] = []
    takers = [i for i, t in enumerate(request.inputs) if not any(key in t.parameters for key in SHM_KEYS)]
    if raw:
        typed = [t.name for t in request.inputs if t.HasField("contents")]
        if typed:
            raise BadRequest(f"inputs {typed} have typed contents and the request has raw_input_contents; send every "
                             "input one way")
        if len(raw) != len(takers):
            raise BadRequest(f"raw_input_contents has {len(raw)} entries; the request has {len(takers)} inputs "
                             "outside shared memory, one entry each in input order")
    chunks = dict(zip(takers, raw, strict=False))
    for index, tensor in enumerate(request.inputs):
        where = f"input '{tensor.name}'"
        params = _parameters(tensor.parameters)
        # KServe's client also sends the HTTP extension's binary_data_size with raw contents: it must agree
        declared = params.pop("binary_data_size", None)
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                                 "parameters": params}
        if index in chunks:
            chunk = chunks[index]
            position = takers.index(index)
            _raw_size_check(chunk, tensor, position, where)
            if declared is not None and (declared is True or declared is False or declared != len(chunk)):
                raise BadRequest(f"{where}: binary_data_size is {declared!r}, raw_input_contents[{position}] has "
                                 f"{len(chunk)} bytes")
            params["binary_data_size"] = len(chunk)
        elif declared is not None:
            raise BadRequest(f"{where}: binary_data_size is given, but the input has no raw_input_contents entry "
                             "(over gRPC the bytes go there)")
        elif index in takers:
            if not tensor.HasField("contents"):
                raise BadRequest(f"{where}: no contents, no raw_input_contents entry and no shared-memory region")
            entry["data"] = _typed_data(tensor, where)
        entries.append(entry)
    header: dict[str, Any] = {"parameters": _parameters(request.parameters), "inputs": entries}
    if request.id:
        header["id"] = request.id
    if request.outputs:
        header["outputs"] = [{"name": out.name, "parameters": _parameters(out.parameters)} for out in request.outputs]
    return header, raw


def decode_infer_request(request: Proto, shared_memory: TensorSource | None,
                         raw: Sequence[bytes | memoryview] | None = None) -> tuple[InferRequest, memoryview]:
    """The parsed request (binary inputs are views of the returned buffer, the raw inputs joined); `raw` as
    `infer_document` takes it."""
    header, raw = infer_document(request, raw)
    binary = aligned_join(raw)
    parsed = parse_infer_document(header, binary, shared_memory)
    if parsed.outputs is not None:
        for out in parsed.outputs:
            out.binary = True  # gRPC answers every output in raw_output_contents
    parsed.binary_output = True
    return parsed, binary


def aligned_join(chunks: Sequence[bytes | memoryview]) -> memoryview:
    """The chunks one after the other in one writable buffer that starts on an ALIGNMENT-byte boundary, as the
    HTTP side reads a body (`posenc.service.request_kit.bodies`): onnxruntime reads aligned inputs in place."""
    total = sum(len(chunk) for chunk in chunks)
    buffer = np.empty(total + ALIGNMENT, np.uint8)  # [total + ALIGNMENT]
    start = (-buffer.ctypes.data) % ALIGNMENT
    view = buffer[start:start + total]  # [total], aligned
    position = 0
    for chunk in chunks:
        view[position:position + len(chunk)] = np.frombuffer(chunk, np.uint8)
        position += len(chunk)
    return memoryview(view.data)


def _set_parameter(target: Proto, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def encode_infer_response(model_name: str, model_version: str, request: InferRequest,
                          outputs: Mapping[str, np.ndarray], order: Sequence[str]) -> bytes:
    """The serialized `ModelInferResponse`: every requested output's bytes in `raw_output_contents` (an empty entry
    for one written to shared memory, so that entry i stays output i's, as tritonclient reads them).

    The message without its raw contents is serialized by protobuf; each `raw_output_contents` field (number 6,
    length-delimited) is appended from the output array's own buffer: the only copy of an output is the one into
    the message (protobuf would copy it into a bytes object first, then into the message)."""
    response = pb.ModelInferResponse(model_name=model_name, model_version=model_version, id=request.id or "")
    raw: list[bytes | memoryview] = []
    for out in requested_outputs(request, order):
        array = np.ascontiguousarray(outputs[out.name])
        tensor = response.outputs.add(name=out.name, datatype=lookup(array.dtype).kserve, shape=list(array.shape))
        if out.shm is not None:
            for key, value in out.shm.parameters(array.nbytes).items():
                _set_parameter(tensor.parameters[key], value)
            raw.append(b"")
        else:
            raw.append(array.reshape(-1).view(np.uint8).data)  # [nbytes], no copy
    parts: list[bytes | memoryview] = [response.SerializeToString()]
    for chunk in raw:
        parts += [RAW_OUTPUT_TAG, _varint(len(chunk)), chunk]
    return b"".join(parts)


RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # ModelInferResponse.raw_output_contents: field 6, length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def stream_response(infer_response: bytes) -> bytes:
    """A serialized `ModelStreamInferResponse` holding a serialized `ModelInferResponse` (field 2)."""
    return b"".join((bytes([2 << 3 | 2]), _varint(len(infer_response)), infer_response))


def model_metadata_message(document: Mapping[str, Any]) -> Proto:
    """The HTTP model metadata document (`model_metadata`) as the gRPC message."""
    response = pb.ModelMetadataResponse(name=document["name"], versions=document["versions"],
                                        platform=document["platform"])
    for side in ("inputs", "outputs"):
        for tensor in document[side]:
            getattr(response, side).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
    return response


def model_config_message(document: Mapping[str, Any]) -> Proto:
    """Triton's model configuration document (`triton_config`) as the gRPC message."""
    config = json_format.ParseDict(document, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    return pb.ModelConfigResponse(config=config)


def statistics_message(documents: Sequence[Mapping[str, Any]]) -> Proto:
    """The engine's statistics documents as the gRPC message."""
    response = pb.ModelStatisticsResponse()
    for document in documents:
        json_format.ParseDict(document, response.model_stats.add(), ignore_unknown_fields=True)
    return response


def repository_index_message(entries: Sequence[Mapping[str, str]]) -> Proto:
    response = pb.RepositoryIndexResponse()
    for entry in entries:
        response.models.add(**entry)
    return response


def shared_memory_status_message(regions: Sequence[Mapping[str, Any]]) -> Proto:
    response = pb.SystemSharedMemoryStatusResponse()
    for region in regions:
        response.regions[region["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
    return response
