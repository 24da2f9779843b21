"""KServe v2 / Open Inference Protocol: the request's types, and parsing an infer request into arrays.

Both JSON tensors (`"data"`: flat or nested row-major list) and the binary tensor extension
(Triton's `binary_tensor_data`): the body is `<JSON header><raw tensor bytes...>`, the header length
is in `Inference-Header-Content-Length`, each binary input declares `parameters.binary_data_size`
and the bytes follow in input order, little-endian, C order. Outputs are sent binary when the
request says so (`parameters.binary_data_output` for all, or `outputs[i].parameters.binary_data`).

System shared memory (Triton's `system_shared_memory` extension, when the server enables it): an input or a
requested output with `parameters.shared_memory_region` (+ `shared_memory_byte_size`, optional
`shared_memory_offset`) names bytes of a registered region instead of carrying them. The parser turns such an
input into an array through a `TensorSource` (the registry of regions,
`posenc.service.inference.shared_memory.registry`); outputs keep
their `ShmRef` and are answered with metadata only, after the route has written them into the region.

Everything malformed is a `BadRequest` (400) with a message naming the tensor and the mismatch;
nothing here knows the model (checks against config.json are in `posenc.service.inference.model_inputs`).
The response side is `posenc.service.inference.codecs.kserve_response`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pydantic_core

from posenc.models.dtypes import BY_KSERVE, cast
from posenc.service.errors import BadRequest, echo, listed
from posenc.service.inference.codecs.kserve_json import (
    LIFT_MIN_BYTES,
    Fallback,
    Span,
    check_syntax,
    lift_data,
    span_array,
)
from posenc.service.inference.shared_memory.refs import SHARED_MEMORY_OFF, ShmRef

HEADER_LENGTH = "Inference-Header-Content-Length"
EXTENSIONS = ["binary_tensor_data"]
SHARED_MEMORY_EXTENSION = "system_shared_memory"
_SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_OUTPUT_KEYS = {"name", "parameters"}
_INPUT_KEYS = {"name", "datatype", "shape", "data", "parameters"}
# numpy's limit on an array's dimensions (NPY_MAXDIMS since numpy 2): a tensor of higher rank cannot be held at all
MAX_RANK = 64


def extensions(shared_memory: bool) -> list[str]:
    """The protocol extensions `GET /v2` advertises."""
    return [*EXTENSIONS, SHARED_MEMORY_EXTENSION] if shared_memory else list(EXTENSIONS)


class TensorSource(Protocol):
    """Where shared-memory inputs are read from (`posenc.service.inference.shared_memory.registry.Lease`)."""

    def input_array(self, ref: ShmRef, dtype: np.dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
        """A read-only array of `shape` and `dtype` over the region's bytes (a view where aligned)."""
        ...


@dataclass
class InputTensor:
    """One decoded request input: `array` has `shape` and the numpy dtype of `datatype` (a view of the region
    `shm` when it was sent in shared memory)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray
    shm: ShmRef | None = None


@dataclass
class RequestedOutput:
    """`shm`: where the output goes instead of the response (then `binary` does not apply)."""

    name: str
    binary: bool
    shm: ShmRef | None = None


@dataclass
class InferRequest:
    """A parsed infer request. `outputs` None = every model output (binary if `binary_output`)."""

    id: str | None
    inputs: list[InputTensor]
    outputs: list[RequestedOutput] | None
    binary_output: bool


def _header_length(value: str | None, body_length: int) -> int:
    """Length of the JSON header: the whole body without the header, else the declared length."""
    if value is None:
        return body_length
    # digits only: int() would also take " 473 ", "+473" and "1_0"
    if not (value.isascii() and value.isdigit()):
        raise BadRequest(f"{HEADER_LENGTH}: not an integer of decimal digits ({echo(value)})")
    if len(value) > 18:  # more than any body (and int() refuses 4,300 digits and more)
        raise BadRequest(f"{HEADER_LENGTH}: {echo(value)} is outside the body (1..{body_length} bytes)")
    length = int(value)
    if not 0 < length <= body_length:
        raise BadRequest(f"{HEADER_LENGTH}: {length} is outside the body (1..{body_length} bytes)")
    return length


def _load_json_header(raw: bytes | bytearray) -> dict[str, Any]:
    try:
        # pydantic-core's Rust parser: ~4x faster than the json module on tensors sent as JSON.
        header = pydantic_core.from_json(raw)
    except ValueError as exc:
        raise BadRequest(f"request header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise BadRequest("request header must be a JSON object with an 'inputs' list")
    return header


def _parameters(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise BadRequest(f"{where}: 'parameters' must be an object")
    return params


def _flag(params: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise BadRequest(f"{where}: parameter '{key}' must be true or false (got {value!r})")
    return value


def check_rank(rank: int, where: str) -> None:
    """400 naming MAX_RANK when a tensor's shape has more dimensions than an array can have (before any data is
    read or allocated: numpy would raise inside the parse)."""
    if rank > MAX_RANK:
        raise BadRequest(f"{where}: shape has rank {rank}; at most {MAX_RANK} dimensions are supported")


def _shape(entry: Mapping[str, Any], where: str) -> tuple[int, ...]:
    shape = entry.get("shape")
    if isinstance(shape, list):
        check_rank(len(shape), where)
    ok = isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    if not ok:
        raise BadRequest(f"{where}: 'shape' must be a list of non-negative integers (got {shape!r})")
    return tuple(shape)  # type: ignore[arg-type]


def _json_data(data: Any, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    """A JSON `data` list (flat or nested) → array of `shape`; element type must fit the datatype."""
    if not isinstance(data, list):
        raise BadRequest(f"{where}: 'data' must be a list")
    try:
        values = np.array(data)
    except ValueError:
        raise BadRequest(f"{where}: 'data' is a ragged nested list") from None
    expected = math.prod(shape)
    if values.size != expected:
        raise BadRequest(f"{where}: 'data' has {values.size} elements, shape {list(shape)} needs {expected}")
    dtype = BY_KSERVE[datatype].numpy
    if dtype.kind in "iu" and values.dtype.kind in "fO":
        values = _wide_integers(data, datatype, where)
    kind = values.dtype.kind
    # JSON true/false are BOOL data only: they are not numbers of any other datatype
    # (integers as Python ints: "O", checked by `_wide_integers`)
    allowed = {"BOOL": "b"}.get(datatype, "iuO" if datatype.startswith(("INT", "UINT")) else "iuf")
    if values.size and kind not in allowed:
        raise BadRequest(f"{where}: 'data' holds {values.dtype.name} values, not valid for {datatype}")
    if kind in "iuO" and values.size and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise BadRequest(f"{where}: 'data' has values outside the {datatype} range")
    return cast(values, dtype).reshape(shape)  # [shape], row-major as sent; bfloat16 rounded once


def _wide_integers(data: list[Any], datatype: str, where: str) -> np.ndarray:
    """Integer data numpy could not hold in one integer type: ints on both sides of 2**63 (uint64 data
    such as [0, 2**64 - 1]) become float64, and beyond 64 bits object. Kept as Python ints (exact) for
    the range check; anything that is not an int (a float, a boolean) is reported as such."""
    values = np.array(data, dtype=object)
    flat = values.reshape(-1)
    wrong = next((v for v in flat if not isinstance(v, int) or isinstance(v, bool)), None)
    if wrong is not None:
        raise BadRequest(f"{where}: 'data' holds {type(wrong).__name__} values, not valid for {datatype}")
    return values


def _input_entry(entry: Any, index: int) -> tuple[str, str, tuple[int, ...], dict[str, Any]]:
    if not isinstance(entry, dict):
        raise BadRequest(f"inputs[{index}] must be an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"inputs[{index}]: 'name' must be a non-empty string")
    where = f"input '{name}'"
    unknown = set(entry) - _INPUT_KEYS
    if unknown:
        raise BadRequest(f"{where}: unknown keys {listed(sorted(unknown))}")
    datatype = entry.get("datatype")
    if not isinstance(datatype, str) or datatype not in BY_KSERVE:
        raise BadRequest(f"{where}: datatype {datatype!r} is not supported; supported: {', '.join(BY_KSERVE)}")
    return name, datatype, _shape(entry, where), _parameters(entry, where)


def _binary_size(params: Mapping[str, Any], where: str) -> int | None:
    if "binary_data_size" not in params:
        return None
    size = params["binary_data_size"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadRequest(f"{where}: binary_data_size must be a non-negative integer (got {size!r})")
    return size


def _non_negative(params: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = params.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{where}: parameter '{key}' must be a non-negative integer (got {value!r})")
    return value


def _shm_ref(params: Mapping[str, Any], where: str, shared_memory: bool) -> ShmRef | None:
    """The shared-memory parameters of a tensor, if it names a region (400 when the extension is off)."""
    if not any(key in params for key in _SHM_KEYS):
        return None
    if not shared_memory:
        raise BadRequest(f"{where}: shared-memory parameters given, but {SHARED_MEMORY_OFF}")
    region = params.get("shared_memory_region")
    if not isinstance(region, str) or not region:
        raise BadRequest(f"{where}: 'shared_memory_region' must name a registered region (got {region!r})")
    return ShmRef(region, _non_negative(params, "shared_memory_offset", where, 0),
                  _non_negative(params, "shared_memory_byte_size", where))


def _shm_array(source: TensorSource, ref: ShmRef, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    dtype = BY_KSERVE[datatype].numpy
    expected = math.prod(shape) * dtype.itemsize
    if ref.byte_size != expected:
        raise BadRequest(f"{where}: shared_memory_byte_size is {ref.byte_size} bytes, shape {list(shape)} "
                         f"{datatype} needs {expected}")
    return source.input_array(ref, dtype, shape, where)


def _parse_inputs(entries: Any, binary: memoryview, source: TensorSource | None, spans: Mapping[str, Span],
                  spans_parsed: set[str]) -> list[InputTensor]:
    if not isinstance(entries, list) or not entries:
        raise BadRequest("'inputs' must be a non-empty list")
    parsed = [_input_entry(entry, i) for i, entry in enumerate(entries)]
    names = [name for name, *_ in parsed]
    if len(set(names)) != len(names):
        raise BadRequest(f"duplicate input names in {listed(names)}")
    sizes = [_binary_size(params, f"input '{name}'") for name, _, _, params in parsed]
    declared = sum(size or 0 for size in sizes)
    if declared > len(binary):
        raise BadRequest(f"binary data is missing: inputs declare {declared} bytes, the body has {len(binary)} "
                         f"after the {HEADER_LENGTH} header")
    if declared < len(binary):
        raise BadRequest(f"trailing bytes: the body has {len(binary)} bytes of binary data, inputs declare {declared}")
    refs = [_shm_ref(params, f"input '{name}'", source is not None) for name, _, _, params in parsed]
    tensors, offset = [], 0
    for (name, datatype, shape, _), entry, size, ref in zip(parsed, entries, sizes, refs, strict=True):
        where = f"input '{name}'"
        if ref is not None and source is not None:  # (no source: _shm_ref has refused the parameters)
            if size is not None or "data" in entry:
                raise BadRequest(f"{where}: shared-memory parameters and 'data' or binary_data_size; send one")
            array = _shm_array(source, ref, datatype, shape, where)
        elif size is None:
            if "data" not in entry:
                raise BadRequest(f"{where}: no 'data' and no binary_data_size")
            data = entry["data"]
            if isinstance(data, str) and data in spans:
                spans_parsed.add(data)  # span_array parses it whole, or falls back
                array = span_array(spans[data], datatype, shape, where)
            else:
                array = _json_data(data, datatype, shape, where)
        else:
            if "data" in entry:
                raise BadRequest(f"{where}: both 'data' and binary_data_size are given; send one")
            array = _binary_array(binary[offset : offset + size], datatype, shape, where)
            offset += size
        tensors.append(InputTensor(name, datatype, shape, array, ref))
    return tensors


def _binary_array(chunk: memoryview, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    dtype = BY_KSERVE[datatype].numpy
    expected = math.prod(shape) * dtype.itemsize
    if len(chunk) != expected:
        raise BadRequest(f"{where}: binary_data_size is {len(chunk)} bytes, shape {list(shape)} {datatype} "
                         f"needs {expected}")
    array = np.frombuffer(chunk, dtype=dtype).reshape(shape)  # [shape], C order as sent
    # The JSON header length can leave the bytes unaligned; onnxruntime wants aligned buffers.
    return array if array.flags.aligned else array.copy()


def _parse_outputs(entries: Any, binary_default: bool, shared_memory: bool) -> list[RequestedOutput] | None:
    if entries is None:
        return None
    if not isinstance(entries, list):
        raise BadRequest("'outputs' must be a list")
    outputs = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise BadRequest(f"outputs[{index}] must be an object with a 'name'")
        where = f"output '{entry['name']}'"
        unknown = set(entry) - _OUTPUT_KEYS
        if unknown:
            raise BadRequest(f"{where}: unknown keys {listed(sorted(unknown))}")
        params = _parameters(entry, where)
        if "classification" in params:
            raise BadRequest(f"{where}: the classification extension is not supported")
        binary = _flag(params, "binary_data", where, binary_default)
        outputs.append(RequestedOutput(entry["name"], binary, _shm_ref(params, where, shared_memory)))
    names = [o.name for o in outputs]
    if len(set(names)) != len(names):
        raise BadRequest(f"duplicate output names in {listed(names)}")
    return outputs


def parse_infer_request(body: bytes | bytearray | memoryview, header_length: str | None,
                        shared_memory: TensorSource | None = None) -> InferRequest:
    """Decode a raw infer body (JSON, or JSON header + binary tensors) into arrays; 400 on anything off.

    Binary inputs are numpy views of `body` (no copy unless unaligned); shared-memory inputs come from
    `shared_memory` (None: the extension is off, and shared-memory parameters are a 400).
    """
    if not len(body):
        raise BadRequest("empty request body; expected a JSON infer request")
    length = _header_length(header_length, len(body))
    if length >= LIFT_MIN_BYTES:
        text, spans = lift_data(memoryview(body)[:length])
        if text is not None:
            try:
                return _parse_lifted(text, spans, body, length, shared_memory)
            except Fallback:
                pass  # the generic parse below gives the exact answer (or error)
            del text, spans
    raw = bytes(body[:length]) if isinstance(body, memoryview) else body[:length]
    return _parse_header(_load_json_header(raw), body, length, shared_memory, {})


def parse_infer_document(header: dict[str, Any], binary: bytes | bytearray | memoryview,
                         shared_memory: TensorSource | None = None) -> InferRequest:
    """An infer request already in the JSON header's form (the gRPC messages:
    `posenc.service.inference.codecs.protobuf`),
    its binary inputs' bytes in `binary`, in input order: the checks and messages of `parse_infer_request`."""
    return _parse_header(header, binary, 0, shared_memory, {})


def _parse_lifted(text: bytes, spans: Mapping[str, Span], body: bytes | bytearray | memoryview,
                  length: int, shared_memory: TensorSource | None) -> InferRequest:
    """`parse_infer_request` of a body whose large data lists were lifted out of its JSON text (`lift_data`).
    A 400 is the generic path's only when every list parses: a syntax error comes first there."""
    try:
        header = pydantic_core.from_json(text)
    except ValueError:
        raise Fallback from None
    if not isinstance(header, dict):
        raise Fallback
    parsed: set[str] = set()
    try:
        return _parse_header(header, body, length, shared_memory, spans, parsed)
    except BadRequest:
        for token, span in spans.items():
            if token not in parsed:
                check_syntax(span)
        raise


def _parse_header(header: dict[str, Any], body: bytes | bytearray | memoryview, length: int,
                  shared_memory: TensorSource | None, spans: Mapping[str, Span],
                  parsed: set[str] | None = None) -> InferRequest:
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest(f"'id' must be a string (got {request_id!r})")
    params = _parameters(header, "request")
    binary_output = _flag(params, "binary_data_output", "request")
    inputs = _parse_inputs(header.get("inputs"), memoryview(body)[length:], shared_memory, spans,
                           set() if parsed is None else parsed)
    outputs = _parse_outputs(header.get("outputs"), binary_output, shared_memory is not None)
    return InferRequest(request_id, inputs, outputs, binary_output)
