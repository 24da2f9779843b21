"""Safe decoders for uploaded tensors (.npy and safetensors); the size-bounded body reader is
`posenc.service.request_kit.bodies`.

Nothing here unpickles or trusts a length: the .npy header is parsed with `ast.literal_eval`
(object dtypes are refused, as `np.load(allow_pickle=False)` would), every declared shape and byte
count is checked against the body with Python integers before numpy sees the data, and safetensors
offsets must tile the data buffer exactly (no holes, no overlaps), as the format specification says
(`safetensors_header`: the header's checks, which the audit's reader makes too).

Content type decides the decoder: `application/x-npy` or `application/x-safetensors`.
`application/octet-stream` (or no Content-Type) is sniffed from the magic bytes: `\\x93NUMPY` is
.npy, an 8-byte length followed by `{` is safetensors. Anything else is a 415 naming the allowed types.
"""

from __future__ import annotations

import ast
import math
import struct
import warnings
from typing import Any, Literal

import numpy as np

from posenc.models.dtypes import BY_NPY, BY_SAFETENSORS, FLOAT_DTYPES, dtype_name
from posenc.service.codec import safetensors_header
from posenc.service.codec.safetensors_header import Entry, checked_shape
from posenc.service.errors import BadRequest, InvalidParameter, UnsupportedMediaType

UploadFormat = Literal["npy", "safetensors"]
UPLOAD_MEDIA_TYPES: dict[str, UploadFormat] = {
    "application/x-npy": "npy",
    "application/x-safetensors": "safetensors",
}
SNIFFED_MEDIA_TYPES = ("application/octet-stream", "")

NPY_MAGIC = b"\x93NUMPY"
# numpy's own default cap on header size (np.lib.format.read_array_header_*, max_header_size)
MAX_NPY_HEADER = 10_000
MAX_SAFETENSORS_HEADER = 1 << 20

# numpy reads '|' (not applicable) on a multi-byte type as native order
_BYTE_ORDERS: dict[str, Literal["<", ">", "="]] = {"<": "<", ">": ">", "=": "=", "|": "="}


def upload_format(content_type: str | None, body_start: bytes) -> UploadFormat:
    """Pick the decoder from Content-Type; octet-stream (or none) is sniffed from the magic bytes."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media in UPLOAD_MEDIA_TYPES:
        return UPLOAD_MEDIA_TYPES[media]
    allowed = ", ".join([*UPLOAD_MEDIA_TYPES, "application/octet-stream (sniffed)"])
    if media not in SNIFFED_MEDIA_TYPES:
        raise UnsupportedMediaType(f"Content-Type {media!r} is not accepted for a tensor upload; use {allowed}")
    if body_start.startswith(NPY_MAGIC):
        return "npy"
    if len(body_start) > 8 and body_start[8:9] == b"{":
        return "safetensors"
    raise BadRequest(f"the body is neither .npy (magic \\x93NUMPY) nor safetensors (length + JSON header); "
                     f"send it with one of {allowed}")


def upload_request_body(description: str) -> dict[str, Any]:
    """The OpenAPI `requestBody` of an upload route: binary in every accepted media type."""
    return {"required": True,
            "description": description + " application/octet-stream is sniffed from the magic bytes.",
            "content": {media: {"schema": {"type": "string", "format": "binary"}}
                        for media in [*UPLOAD_MEDIA_TYPES, "application/octet-stream"]}}


def decode_float_tensor(body: bytes, content_type: str | None, field: str) -> np.ndarray:
    """`decode_tensor` of the tensor `weight` (or the only one), which must hold floats (422 naming `field`)."""
    array = decode_tensor(body, content_type, "weight")
    if dtype_name(array.dtype) not in FLOAT_DTYPES:
        raise InvalidParameter(f"{field}: must be a float tensor ({', '.join(FLOAT_DTYPES)}), "
                               f"got {dtype_name(array.dtype)}")
    return array


def decode_tensor(body: bytes, content_type: str | None, name: str = "weight") -> np.ndarray:
    """Decode one uploaded tensor: .npy, or the tensor `name` (or the only one) of a safetensors file.

    Returns a native-endian, C-contiguous, writeable copy.
    """
    if upload_format(content_type, body[:16]) == "npy":
        return decode_npy(body)
    return decode_safetensors(body, name)


# ---------------------------------------------------------------------------------------------- npy


def decode_npy(body: bytes) -> np.ndarray:
    """Parse a .npy file (format versions 1.0, 2.0, 3.0) without pickle.

    Checks: magic and version, header length within the body, header a literal dict with exactly
    descr/fortran_order/shape, a plain numeric descr (no object, structured or void dtypes), a shape
    of non-negative ints, and a data section of exactly prod(shape) · itemsize bytes.
    """
    if not body.startswith(NPY_MAGIC):
        raise BadRequest("npy: the body does not start with the .npy magic \\x93NUMPY")
    if len(body) < 10:
        raise BadRequest(f"npy: truncated: {len(body)} bytes, the fixed prelude alone is 10")
    major, minor = body[6], body[7]
    if (major, minor) not in ((1, 0), (2, 0), (3, 0)):
        raise BadRequest(f"npy: unsupported format version {major}.{minor} (1.0, 2.0 and 3.0 are read)")
    length_format = "<H" if major == 1 else "<I"
    prelude = 8 + struct.calcsize(length_format)
    if len(body) < prelude:
        raise BadRequest(f"npy: truncated: {len(body)} bytes, the version {major}.0 prelude is {prelude}")
    (header_len,) = struct.unpack_from(length_format, body, 8)
    if header_len > MAX_NPY_HEADER:
        raise BadRequest(f"npy: header length {header_len} exceeds the {MAX_NPY_HEADER}-byte limit")
    if len(body) < prelude + header_len:
        raise BadRequest(f"npy: truncated header: it declares {header_len} bytes, the body has "
                         f"{len(body) - prelude} after the prelude")
    encoding = "utf-8" if major == 3 else "latin-1"
    try:
        text = body[prelude:prelude + header_len].decode(encoding)
    except UnicodeDecodeError:
        raise BadRequest(f"npy: header is not valid {encoding}") from None
    dtype, fortran_order, shape = _npy_header_fields(text)
    data = memoryview(body)[prelude + header_len:]
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise BadRequest(f"npy: the header declares shape {list(shape)} of {dtype.str} = {expected} bytes of "
                         f"data, the body has {len(data)}")
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape))
    array = flat.reshape(shape, order="F" if fortran_order else "C")
    return array.astype(dtype.newbyteorder("="), order="C", copy=True)


def _npy_header_fields(text: str) -> tuple[np.dtype, bool, tuple[int, ...]]:
    try:
        with warnings.catch_warnings():
            # an odd escape sequence in a string is a compile warning; here it is a malformed header
            warnings.simplefilter("error")
            header = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, Warning):
        raise BadRequest("npy: header is not a Python literal dict") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise BadRequest("npy: header must be a dict with exactly the keys 'descr', 'fortran_order', 'shape'")
    fortran_order = header["fortran_order"]
    if not isinstance(fortran_order, bool):
        raise BadRequest("npy: 'fortran_order' must be True or False")
    return _npy_dtype(header["descr"]), fortran_order, checked_shape(header["shape"], "npy")


def _npy_dtype(descr: Any) -> np.dtype:
    """A plain numeric descr such as '<f4'; object ('O'), structured (lists) and void dtypes are refused."""
    if not isinstance(descr, str):
        raise BadRequest("npy: structured dtypes are not accepted (descr must be a string such as '<f4')")
    if "O" in descr:
        raise BadRequest("npy: object arrays are not accepted (they need pickle, and allow_pickle is off)")
    order, kind = (descr[0], descr[1:]) if descr[:1] in _BYTE_ORDERS else ("=", descr)
    if kind not in BY_NPY:
        raise BadRequest(f"npy: dtype {descr!r} is not accepted; accepted kinds: " + ", ".join(BY_NPY))
    return BY_NPY[kind].numpy.newbyteorder(_BYTE_ORDERS[order])


# -------------------------------------------------------------------------------------- safetensors


def decode_safetensors(body: bytes, name: str = "weight") -> np.ndarray:
    """Parse a safetensors file and return tensor `name`, or its only tensor.

    Checks: 8-byte little-endian header length within the body, a UTF-8 JSON object without
    duplicate keys, known dtype codes, non-negative integer shapes, and data_offsets that match
    prod(shape) · itemsize and tile the data buffer from 0 to its end without holes or overlaps.
    """
    entries, data, _ = _safetensors_parts(body)
    if name in entries:
        chosen = name
    elif len(entries) == 1:
        (chosen,) = entries
    else:
        raise BadRequest(f"safetensors: no tensor named {name!r} and not exactly one tensor; found "
                         + (", ".join(sorted(entries)) or "none"))
    return _entry_array(data, entries[chosen])


def decode_safetensors_bundle(body: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor of a safetensors file (native byte order, C order, in header order) and its
    `__metadata__`, with the checks of `decode_safetensors`."""
    entries, data, metadata = _safetensors_parts(body)
    return {name: _entry_array(data, entry) for name, entry in entries.items()}, metadata


def _safetensors_parts(body: bytes) -> tuple[dict[str, Entry], memoryview, dict[str, str]]:
    if len(body) < 8:
        raise BadRequest(f"safetensors: truncated: {len(body)} bytes, the header length field alone is 8")
    (header_len,) = struct.unpack_from("<Q", body, 0)
    if header_len > min(len(body) - 8, MAX_SAFETENSORS_HEADER):
        raise BadRequest(f"safetensors: header length {header_len} exceeds the body ({len(body) - 8} bytes "
                         f"after the length field) or the {MAX_SAFETENSORS_HEADER}-byte limit")
    header = safetensors_header.parse(body[8:8 + header_len])
    data = memoryview(body)[8 + header_len:]
    entries, _ = safetensors_header.entries(header, len(data))
    return entries, data, header.get("__metadata__", {})


def _entry_array(data: memoryview, entry: Entry) -> np.ndarray:
    dtype = BY_SAFETENSORS[entry.dtype].numpy
    flat = np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=math.prod(entry.shape), offset=entry.begin)
    return flat.reshape(entry.shape).astype(dtype, order="C", copy=True)
