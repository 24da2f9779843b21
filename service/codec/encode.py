"""Wire formats for tensors: safetensors, npy, raw and json (and png pictures), and the negotiation between them.

Binary encoders write a header and then the array's own buffer: the response body is built with one
copy of the data (no intermediate `tobytes()`), little-endian and C order.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import pydantic_core

from posenc.models.dtypes import cast, dtype_name, lookup, np_dtype
from posenc.service.errors import NotAcceptable, echo

Format = Literal["safetensors", "npy", "raw", "json", "png"]
FORMATS: tuple[str, ...] = get_args(Format)
# The formats that carry the values; png is a picture of them. Error messages list these (their wording is pinned).
DATA_FORMATS: tuple[str, ...] = tuple(f for f in FORMATS if f != "png")
DEFAULT_FORMAT: Format = "safetensors"

MEDIA_TYPES: dict[str, str] = {
    "safetensors": "application/x-safetensors",
    "npy": "application/x-npy",
    "raw": "application/octet-stream",
    "json": "application/json",
    "png": "image/png",  # a picture of the tensors (posenc.service.tables.png), not their values
}
FILE_SUFFIX = {"safetensors": ".safetensors", "npy": ".npy", "raw": ".bin", "json": ".json", "png": ".png"}
SINGLE_TENSOR_FORMATS = ("npy", "raw")



@dataclass
class Bundle:
    """Named tensors plus string metadata: what every table endpoint produces."""

    tensors: dict[str, np.ndarray]
    metadata: dict[str, str] = field(default_factory=dict)


def negotiate_format(format_param: str | None, accept: str | None) -> Format:
    """`?format=` wins; else the best supported media type of `Accept`; else safetensors.

    An explicit format or an Accept header naming only unsupported types → 406.
    """
    if format_param is not None:
        if format_param not in FORMATS:
            raise NotAcceptable(f"format: unsupported format {echo(format_param)}; "
                                f"supported: {', '.join(DATA_FORMATS)}")
        return format_param  # type: ignore[return-value]
    if not accept or not accept.strip():
        return DEFAULT_FORMAT
    by_media = {media: name for name, media in MEDIA_TYPES.items()}
    best: tuple[float, int, Format] | None = None
    for position, item in enumerate(accept.split(",")):
        parts = [p.strip() for p in item.split(";")]
        media = parts[0].lower()
        quality = 1.0
        for param in parts[1:]:
            if param.startswith("q="):
                try:
                    quality = float(param[2:])
                except ValueError:
                    quality = 0.0
        if quality <= 0.0:
            continue
        if media in by_media:
            chosen: Format = by_media[media]  # type: ignore[assignment]
        elif media in ("*/*", "application/*"):
            chosen = DEFAULT_FORMAT
        else:
            continue
        # Highest quality wins; among equals, the first listed.
        if best is None or (quality, -position) > (best[0], -best[1]):
            best = (quality, position, chosen)
    if best is None:
        raise NotAcceptable(
            f"Accept: none of {echo(accept)} is served; use one of "
            + ", ".join(MEDIA_TYPES.values()) + " or ?format=" + "|".join(FORMATS)
        )
    return best[2]


def _le_contiguous(array: np.ndarray) -> np.ndarray:
    """C-contiguous little-endian view (a copy only when the input is neither)."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    # asarray keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
    return np.asarray(array, order="C")


def byte_view(array: np.ndarray) -> memoryview:
    """The array's buffer as bytes, without copying (works for ml_dtypes' bfloat16 too)."""
    return memoryview(array.reshape(-1).view(np.uint8).data)


def encode_safetensors(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """safetensors file: u64 header length, JSON header (space-padded to 8 bytes), tensor bytes."""
    arrays = {name: _le_contiguous(a) for name, a in tensors.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, array in arrays.items():
        header[name] = {
            "dtype": lookup(array.dtype).safetensors,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    parts: list[bytes | memoryview] = [struct.pack("<Q", len(header_bytes)), header_bytes]
    parts.extend(byte_view(a) for a in arrays.values())
    return b"".join(parts)


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """NPY v1.0 (v2.0 when the header outgrows 64 KiB) header, padded so data starts 64-aligned."""
    code = lookup(dtype).npy
    if code is None:
        raise ValueError(f"npy cannot represent {dtype_name(dtype)}")
    descr = ("<" if dtype.itemsize > 1 else "|") + code
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))  # noqa: UP031
    for version, length_format in ((1, "<H"), (2, "<I")):
        prefix_len = 6 + 2 + struct.calcsize(length_format)
        padded = text + " " * (-(prefix_len + len(text) + 1) % 64) + "\n"
        if version == 2 or len(padded) < 1 << 16:
            return b"\x93NUMPY" + bytes([version, 0]) + struct.pack(length_format, len(padded)) + padded.encode()
    raise AssertionError("unreachable")


def encode_npy(array: np.ndarray) -> bytes:
    array = _le_contiguous(array)
    return b"".join((npy_header(array.dtype, array.shape), byte_view(array)))


def encode_raw(array: np.ndarray) -> bytes:
    return bytes(byte_view(_le_contiguous(array)))


def raw_headers(name: str, array: np.ndarray) -> dict[str, str]:
    return {
        "X-Tensor-Name": name,
        "X-Tensor-Dtype": dtype_name(array.dtype),
        "X-Tensor-Shape": ",".join(str(n) for n in array.shape),
    }


def json_values(array: np.ndarray) -> list[Any]:
    """Flat row-major values; non-finite floats become the strings "Infinity", "-Infinity", "NaN"."""
    flat = array.reshape(-1)
    if flat.dtype.kind in "iub":
        return list(flat.tolist())
    values: list[Any] = flat.astype(np.float64).tolist()
    if not np.isfinite(flat.astype(np.float64)).all():
        values = [v if math.isfinite(v) else ("NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity"))
                  for v in values]
    return values


def encode_json(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    doc = {
        "tensors": {
            name: {"dtype": dtype_name(a.dtype), "shape": list(a.shape), "data": json_values(a)}
            for name, a in tensors.items()
        },
        "metadata": dict(metadata),
    }
    # Non-finite values are strings by now; pydantic-core serialises long lists ~5x faster than json.
    return pydantic_core.to_json(doc)


def decode_json_tensor(doc: Mapping[str, Any]) -> np.ndarray:
    """Inverse of one entry of `encode_json` (for clients and tests)."""
    def value(v: Any) -> float:
        return float(v.replace("Infinity", "inf")) if isinstance(v, str) else v

    dtype = np_dtype(doc["dtype"])
    data = [value(v) for v in doc["data"]]
    return cast(np.asarray(data, dtype=np.float64 if dtype.kind == "V" else None), dtype).reshape(doc["shape"])
