"""The KServe v2 gRPC messages (`inference.GRPCInferenceService`, as Triton extends it) to and from the service's
own request and response types.

The messages are the ones `tritonclient` ships, generated from Triton's `grpc_service.proto` and
`model_config.proto` (BSD-3-Clause, github.com/triton-inference-server/common): posenc keeps no copy of them.

An infer request is turned into the JSON header's form of the HTTP protocol and parsed by the same parser
(`posenc.service.inference.codecs.kserve_request.parse_infer_document`), so both protocols apply one set of rules
with one set
of messages. What only gRPC has is checked here: `raw_input_contents` (one entry per input outside shared
memory, in input order, its length that of the tensor) and typed `contents` (the field of the datatype, as
Triton reads it; FP16 and BF16 travel as raw bytes only). Outputs are always answered in `raw_output_contents`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from posenc.models.dtypes import BY_KSERVE, lookup
from posenc.service.errors import BadRequest, listed
from posenc.service.inference.codecs.kserve_request import (
    InferRequest,
    TensorSource,
    check_rank,
    parse_infer_document,
)
from posenc.service.inference.codecs.kserve_response import requested_outputs
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
FIELD_NUMBERS = {"bool_contents": 1, "int_contents": 2, "int64_contents": 3, "uint_contents": 4,
                 "uint64_contents": 5, "fp32_contents": 6, "fp64_contents": 7}
CONTENTS_FIELD_OF = {datatype: FIELD_NUMBERS[name] for datatype, name in CONTENTS_FIELD.items()}
PROTO_DTYPES: dict[int, type] = {1: np.bool_, 2: np.int32, 3: np.int64, 4: np.uint32, 5: np.uint64,
                                 6: np.float32, 7: np.float64}


def parameter_value(parameter: Proto) -> Any:
    """The value an `InferParameter` holds (None when none of its fields is set)."""
    which = parameter.WhichOneof("parameter_choice")
    return None if which is None else getattr(parameter, which)


def _parameters(params: Mapping[str, Proto]) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in params.items()}


def _typed_input(tensor: Proto, contents: TypedContents | None, where: str) -> TypedContents | None:
    """The tensor's typed `contents` (read apart by the walk, or protobuf's), its fields checked against the
    datatype; None where the datatype is not one posenc serves (the parser names it)."""
    if contents is None:
        contents = _message_contents(tensor)
    contents.datatype = tensor.datatype
    present = {name for name in ALL_CONTENTS_FIELDS if len(getattr(tensor.contents, name))} | set(contents.used())
    used = [name for name in ALL_CONTENTS_FIELDS if name in present]
    field = CONTENTS_FIELD.get(tensor.datatype)
    if field is None:
        if tensor.datatype in BY_KSERVE:
            raise BadRequest(f"{where}: datatype {tensor.datatype} has no typed contents; send its bytes in "
                             "raw_input_contents")
        return None  # the parser names the unsupported datatype
    wrong = [name for name in used if name != field]
    if wrong:
        raise BadRequest(f"{where}: datatype {tensor.datatype} takes its contents in {field} (got {', '.join(wrong)})")
    return contents


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
# ModelInferRequest: parameters 4, inputs 5, outputs 6; InferInputTensor: datatype 2, shape 3, parameters 4,
# contents 5; InferTensorContents: the typed fields 1-7 (bytes_contents, 8, stays with protobuf)
PARAMETERS_FIELD, INPUTS_FIELD, OUTPUTS_FIELD = 4, 5, 6
DATATYPE_FIELD, SHAPE_FIELD, CONTENTS_NUMBER, CONTENTS_TAG = 2, 3, 5, bytes([5 << 3 | 2])
TYPED_FIELDS: dict[int, str] = {1: "bool_contents", 2: "int_contents", 3: "int64_contents", 4: "uint_contents",
                                5: "uint64_contents", 6: "fp32_contents", 7: "fp64_contents"}
FIXED_WIDTH: dict[int, tuple[int, str]] = {6: (4, "<f4"), 7: (8, "<f8")}  # field -> (wire width, dtype)
FIXED_WIRE = {4: 5, 8: 1}  # width -> wire type of one unpacked element
# At most this many fields and entries in one ModelInferRequest, counted over the walked levels (the request,
# its inputs and outputs, their contents, shape dimensions and parameters): a real request has a handful, and
# each one walked is Python work and, in protobuf's message, objects.
MAX_FIELDS = 100_000
VARINT_WINDOW = 1 << 18  # bytes of packed varints decoded at a time (bounds the decode's temporaries)


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


class _Fields:
    """The count of fields walked in one message, refused past MAX_FIELDS (before any object is built for them)."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, count: int = 1) -> None:
        self.count += count
        if self.count > MAX_FIELDS:
            raise BadRequest(f"the {pb.ModelInferRequest.DESCRIPTOR.full_name} message has more than {MAX_FIELDS} "
                             "fields and entries (inputs, outputs, parameters, shape dimensions, typed contents "
                             "pieces, unknown fields); send tensors in raw_input_contents")


def _walk(view: memoryview, start: int, end: int, fields: _Fields) -> Iterator[tuple[int, int, int, int, int]]:
    """The fields of the message in `view[start:end]`: (number, wire type, field start, value start, value end),
    where a varint's or fixed field's value is its bytes and a length-delimited one's its payload. ValueError or
    IndexError where it is not a message the walk follows (protobuf then reads it)."""
    position = start
    while position < end:
        fields.add()
        begin = position
        key, position = _read_varint(view, position)
        wire = key & 7
        value = position
        if wire == 0:
            position = _read_varint(view, position)[1]
        elif wire == 1:
            position += 8
        elif wire == 5:
            position += 4
        elif wire == LENGTH_DELIMITED:
            length, value = _read_varint(view, position)
            position = value + length
        else:
            raise ValueError(f"wire type {wire}")
        if position > end:
            raise ValueError("truncated field")
        yield key >> 3, wire, begin, value, position


def _count_varints(payload: memoryview) -> int:
    """The number of varints packed in `payload` (ValueError when the last one is cut)."""
    data = np.frombuffer(payload, np.uint8)
    if len(data) and data[-1] >= 0x80:
        raise ValueError("truncated packed varints")
    return sum(int(np.count_nonzero(data[i:i + VARINT_WINDOW] < 0x80)) for i in range(0, len(data), VARINT_WINDOW))


def _varint_chunks(payload: memoryview) -> Iterator[np.ndarray]:
    """The varints packed in `payload` as uint64 arrays, in order, a window at a time: a vectorised decode whose
    temporaries are a few times VARINT_WINDOW, whatever the payload's size."""
    data = np.frombuffer(payload, np.uint8)
    position = 0
    while position < len(data):
        window = data[position:position + VARINT_WINDOW]
        ends = np.flatnonzero(window < 0x80)  # the last byte of each varint
        if not len(ends):
            raise BadRequest(f"malformed {pb.ModelInferRequest.DESCRIPTOR.full_name} message: a packed varint is "
                             "cut or too long")
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        lengths = ends - starts + 1
        longest = int(lengths.max())
        if longest > 10:
            raise BadRequest(f"malformed {pb.ModelInferRequest.DESCRIPTOR.full_name} message: a packed varint of "
                             f"{longest} bytes")
        values = (window[starts] & 0x7F).astype(np.uint64)
        for k in range(1, longest):
            more = np.flatnonzero(lengths > k)
            values[more] |= (window[starts[more] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        yield values
        position += int(ends[-1]) + 1


@dataclass
class TypedContents:
    """One input's typed `contents`, read apart: each typed field's packed payloads (an unpacked element is a
    payload of one), and its element count, known before anything is decoded."""

    datatype: str = ""
    payloads: dict[int, list[memoryview]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    source: Any = None  # the repeated field of the datatype, where protobuf read the contents

    def add(self, number: int, payload: memoryview) -> None:
        width = FIXED_WIDTH.get(number)
        if width is not None:
            if len(payload) % width[0]:
                raise ValueError(f"packed fixed{width[0] * 8} of {len(payload)} bytes")
            count = len(payload) // width[0]
        else:
            count = _count_varints(payload)
        self.payloads.setdefault(number, []).append(payload)
        self.counts[number] = self.counts.get(number, 0) + count

    def used(self) -> list[str]:
        return [TYPED_FIELDS[number] for number, count in self.counts.items() if count]

    def count(self) -> int:
        return sum(self.counts.values())

    def nbytes(self) -> int:
        """The bytes decoding takes: the decoded elements, in the datatype (8 each when it is unknown)."""
        dtype = BY_KSERVE.get(self.datatype)
        return self.count() * (dtype.numpy.itemsize if dtype is not None else 8)

    def chunks(self, number: int) -> Iterator[np.ndarray]:
        """The values of field `number`, in order, as arrays of its protobuf type (a window at a time)."""
        if self.source is not None:
            yield np.fromiter(self.source, PROTO_DTYPES[number], len(self.source))
            return
        for payload in self.payloads.get(number, ()):
            width = FIXED_WIDTH.get(number)
            if width is not None:
                yield np.frombuffer(payload, width[1])
                continue
            for raw in _varint_chunks(payload):
                if number == 1:
                    yield raw != 0
                elif number == 2:  # int32: protobuf keeps the low 32 bits
                    yield raw.astype(np.uint32).view(np.int32)
                elif number == 3:
                    yield raw.view(np.int64)
                elif number == 4:
                    yield raw.astype(np.uint32)
                else:
                    yield raw

    def decode_into(self, out: np.ndarray, number: int, where: str) -> None:
        """The values of field `number` written into `out` (uint8, this input's bytes) as the datatype's array;
        the HTTP parser's message when one is outside the datatype's range."""
        dtype = BY_KSERVE[self.datatype].numpy
        target = out.view(dtype)
        position = 0
        for values in self.chunks(number):
            if dtype.kind in "iu" and len(values):
                info = np.iinfo(dtype)
                if values.min() < info.min or values.max() > info.max:
                    raise BadRequest(f"{where}: 'data' has values outside the {self.datatype} range")
            target[position:position + len(values)] = values
            position += len(values)


class RawInputs(list[memoryview]):
    """A request's `raw_input_contents` as views of its bytes, and its typed contents read apart (by input index):
    `decoded` bytes are what decoding them takes, known before they are decoded (the servicer reserves them)."""

    def __init__(self, chunks: Iterable[memoryview] = (), typed: dict[int, TypedContents] | None = None) -> None:
        super().__init__(chunks)
        self.typed = typed or {}
        self.decoded = sum(contents.nbytes() for contents in self.typed.values())


def decoded_bytes(raw: Sequence[bytes | memoryview]) -> int:
    """The bytes decoding a split request's typed contents takes (`RawInputs.decoded`; 0 for a plain list)."""
    return raw.decoded if isinstance(raw, RawInputs) else 0


def _tensor(view: memoryview, start: int, end: int, fields: _Fields,
            contents: TypedContents) -> list[memoryview | bytes]:
    """An InferInputTensor's bytes without its typed contents (`contents` gets them), every field counted."""
    kept: list[memoryview | bytes] = []
    for number, wire, begin, value, position in _walk(view, start, end, fields):
        if number == DATATYPE_FIELD and wire == LENGTH_DELIMITED:
            contents.datatype = bytes(view[value:position]).decode("utf-8", "replace")
        elif number == SHAPE_FIELD and wire == LENGTH_DELIMITED:
            fields.add(_count_varints(view[value:position]))
        if number == CONTENTS_NUMBER and wire == LENGTH_DELIMITED:
            rest: list[memoryview] = []
            for inner, inner_wire, inner_begin, inner_value, inner_end in _walk(view, value, position, fields):
                width = FIXED_WIDTH.get(inner, (0, ""))[0]
                unpacked = FIXED_WIRE.get(width, 0)
                if inner in TYPED_FIELDS and inner_wire in (LENGTH_DELIMITED, unpacked):
                    contents.add(inner, view[inner_value:inner_end])
                else:
                    rest.append(view[inner_begin:inner_end])
            payload = b"".join(rest)
            kept += [CONTENTS_TAG, varint(len(payload)), payload]
        else:
            kept.append(view[begin:position])
    return kept


def split_infer_request(data: bytes) -> tuple[Proto, RawInputs]:
    """A serialized `ModelInferRequest` as the message without its `raw_input_contents` nor typed contents, and
    those entries as views of `data`, in order (`RawInputs`, with the typed contents read apart): protobuf would
    copy each raw entry into the message, then again into a new bytes object at every access (upb), where here the
    raw bytes are copied once, into the aligned buffer (`aligned_join`); and typed contents are decoded by numpy
    straight into that buffer, once their size is reserved, where protobuf would build them first.

    The request, its inputs, outputs and parameters are walked, at most MAX_FIELDS fields and entries in all (a
    400 past that, before anything is built for them: the walk is linear, each field a few operations); the rest
    is parsed by protobuf, so its rules and errors are protobuf's. Anything the walk does not follow (a group, a
    truncated field) is left to protobuf on the whole message (DecodeError where malformed)."""
    view = memoryview(data).cast("B")
    fields = _Fields()
    rest: list[memoryview | bytes] = []  # the other fields' bytes, in order
    raw: list[memoryview] = []
    typed: dict[int, TypedContents] = {}
    inputs = 0
    try:
        for number, wire, begin, value, position in _walk(view, 0, len(view), fields):
            if wire != LENGTH_DELIMITED:
                rest.append(view[begin:position])
            elif number == RAW_INPUT_FIELD:
                raw.append(view[value:position])
            elif number == INPUTS_FIELD:
                contents = TypedContents()
                tensor = _tensor(view, value, position, fields, contents)
                if contents.payloads:
                    typed[inputs] = contents
                inputs += 1
                payload = b"".join(tensor)
                rest += [bytes([INPUTS_FIELD << 3 | LENGTH_DELIMITED]), varint(len(payload)), payload]
            else:
                if number == OUTPUTS_FIELD:  # (its parameters: one field an entry)
                    for _ in _walk(view, value, position, fields):
                        pass
                rest.append(view[begin:position])
    except (IndexError, ValueError):
        message = service_pb2.ModelInferRequest.FromString(data)  # DecodeError where malformed
        return message, RawInputs(message.raw_input_contents, _message_typed(message))
    return service_pb2.ModelInferRequest.FromString(b"".join(rest)), RawInputs(raw, typed)


def _message_typed(message: Proto) -> dict[int, TypedContents]:
    return {index: _message_contents(tensor) for index, tensor in enumerate(message.inputs)
            if tensor.HasField("contents")}


def _message_contents(tensor: Proto) -> TypedContents:
    """The typed contents protobuf read (a message built in process, or one the walk left to protobuf)."""
    contents = TypedContents(datatype=tensor.datatype)
    for number, name in TYPED_FIELDS.items():
        values = getattr(tensor.contents, name)
        if len(values):
            contents.counts[number] = len(values)
            if CONTENTS_FIELD_OF.get(tensor.datatype) == number:
                contents.source = values
    return contents


@dataclass
class _TypedChunk:
    """An input's typed contents, decoded into the aligned buffer by `aligned_join`."""

    contents: TypedContents
    number: int
    where: str
    size: int

    def __len__(self) -> int:
        return self.size


def infer_document(request: Proto, raw: Sequence[bytes | memoryview] | None = None
                   ) -> tuple[dict[str, Any], list[bytes | memoryview | _TypedChunk]]:
    """The request as the HTTP protocol's JSON header, and its binary inputs in input order: the raw ones, or the
    typed contents (each one's `binary_data_size` that of its decoded bytes; 400 where gRPC's own rules are
    broken). `raw`: the request's `raw_input_contents` where read apart (`split_infer_request`)."""
    typed = raw.typed if isinstance(raw, RawInputs) else {}
    raw = list(request.raw_input_contents) if raw is None else list(raw)  # (upb copies an entry at each access)
    entries: list[dict[str, Any]] = []
    takers = [i for i, t in enumerate(request.inputs) if not any(key in t.parameters for key in SHM_KEYS)]
    if raw:
        named = [t.name for t in request.inputs if t.HasField("contents")]
        if named:
            raise BadRequest(f"inputs {listed(named)} have typed contents and the request has raw_input_contents; "
                             "send every input one way")
        if len(raw) != len(takers):
            raise BadRequest(f"raw_input_contents has {len(raw)} entries; the request has {len(takers)} inputs "
                             "outside shared memory, one entry each in input order")
    chunks = dict(zip(takers, raw, strict=False))
    decoded: list[_TypedChunk] = []  # typed contents, into the binary buffer (one request: raw or typed)
    for tensor in request.inputs:  # before any size below is computed from a shape
        check_rank(len(tensor.shape), f"input '{tensor.name}'")
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
            contents = _typed_input(tensor, typed.get(index), where)
            if contents is None:
                entry["data"] = []
            else:
                number = CONTENTS_FIELD_OF[tensor.datatype]
                count = contents.counts.get(number, 0)
                if all(d >= 0 for d in tensor.shape) and count != math.prod(tensor.shape):
                    raise BadRequest(f"{where}: 'data' has {count} elements, shape {list(tensor.shape)} needs "
                                     f"{math.prod(tensor.shape)}")
                size = count * BY_KSERVE[tensor.datatype].numpy.itemsize
                params["binary_data_size"] = size
                decoded.append(_TypedChunk(contents, number, where, size))
        entries.append(entry)
    header: dict[str, Any] = {"parameters": _parameters(request.parameters), "inputs": entries}
    if request.id:
        header["id"] = request.id
    if request.outputs:
        header["outputs"] = [{"name": out.name, "parameters": _parameters(out.parameters)} for out in request.outputs]
    return header, [*raw, *decoded]


def decode_infer_request(request: Proto, shared_memory: TensorSource | None,
                         raw: Sequence[bytes | memoryview] | None = None) -> tuple[InferRequest, memoryview]:
    """The parsed request (binary inputs are views of the returned buffer, the raw inputs joined); `raw` as
    `infer_document` takes it."""
    header, chunks = infer_document(request, raw)
    binary = aligned_join(chunks)
    parsed = parse_infer_document(header, binary, shared_memory)
    if parsed.outputs is not None:
        for out in parsed.outputs:
            out.binary = True  # gRPC answers every output in raw_output_contents
    parsed.binary_output = True
    return parsed, binary


def aligned_join(chunks: Sequence[bytes | memoryview | _TypedChunk]) -> memoryview:
    """The chunks one after the other in one writable buffer that starts on an ALIGNMENT-byte boundary, as the
    HTTP side reads a body (`posenc.service.request_kit.bodies`): onnxruntime reads aligned inputs in place."""
    total = sum(len(chunk) for chunk in chunks)
    buffer = np.empty(total + ALIGNMENT, np.uint8)  # [total + ALIGNMENT]
    start = (-buffer.ctypes.data) % ALIGNMENT
    view = buffer[start:start + total]  # [total], aligned
    position = 0
    for chunk in chunks:
        if isinstance(chunk, _TypedChunk):  # decoded straight into its place
            chunk.contents.decode_into(view[position:position + len(chunk)], chunk.number, chunk.where)
        else:
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
        parts += [RAW_OUTPUT_TAG, varint(len(chunk)), chunk]
    return b"".join(parts)


RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # ModelInferResponse.raw_output_contents: field 6, length-delimited


def varint(value: int) -> bytes:
    """`value` (non-negative) as a protobuf varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def stream_response(infer_response: bytes) -> bytes:
    """A serialized `ModelStreamInferResponse` holding a serialized `ModelInferResponse` (field 2)."""
    return b"".join((bytes([2 << 3 | 2]), varint(len(infer_response)), infer_response))


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
