"""The safetensors header, checked once for every reader of it: the upload decoder (`decode.py`), which holds the
whole file, and the audit's reader (`posenc.service.audit.safetensors_reader`), which reads the header and then
only a few tensors after it.

The header is UTF-8 JSON without duplicate keys: an object whose entries are `__metadata__` (strings to strings)
and tensors, each exactly `dtype`, `shape` and `data_offsets`: a known dtype code, a shape of at most `MAX_NDIM`
non-negative integers, and offsets [begin, end] within the data section that span prod(shape) elements of the
dtype. Sorted by begin, the tensors tile the data section from 0 to its end, without holes or overlaps, as the
format specification says. A refusal is a 400 that names the tensor and what is wrong.

Here too is the check that a JSON document is an object (`json_object`), one message for the header and for the
audit's JSON documents (a config.json, `?config=`, the extract).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from posenc.models.dtypes import BY_SAFETENSORS
from posenc.service.errors import BadRequest

MAX_NDIM = 32
# a value echoed in a refusal is cut here: a hostile header may put megabytes in one name or list
SHOWN = 120

# The dtype codes of the upload decoder, in bits per element: those it can return as numpy arrays.
CODEC_BITS: dict[str, int] = {code: d.numpy.itemsize * 8 for code, d in BY_SAFETENSORS.items()}
# Every dtype code of the format (safetensors 0.8's `Dtype`), in bits per element. A reader that never turns the
# tensors into arrays (the audit reads a header and a few float tensors) takes them all: FP8 checkpoints
# (DeepSeek-V3's, for one) are real files. It holds every code of CODEC_BITS, with the same sizes.
FORMAT_BITS: dict[str, int] = {
    **CODEC_BITS,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "C64": 64,
}


@dataclass(frozen=True)
class Entry:
    """One tensor of the header: its dtype code ("F32", "BF16", ...), shape, and byte offsets [begin, end) in the
    data section (after the 8-byte length and the header)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def shown(value: Any) -> str:
    """`repr(value)`, cut to SHOWN characters."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


def json_object(document: Any, what: str) -> dict[str, Any]:
    """`document` itself when it is a JSON object (a dict); else the 400 `{what} must be a JSON object`."""
    if not isinstance(document, dict):
        raise BadRequest(f"{what} must be a JSON object")
    return document


def checked_shape(shape: Any, what: str) -> tuple[int, ...]:
    """A tuple/list of non-negative ints (bools are not ints here), at most MAX_NDIM of them."""
    if not isinstance(shape, (tuple, list)) or len(shape) > MAX_NDIM:
        raise BadRequest(f"{what}: shape must be a list of at most {MAX_NDIM} non-negative integers")
    if not all(type(n) is int and n >= 0 for n in shape):
        raise BadRequest(f"{what}: shape {shown(shape)} must contain non-negative integers only")
    return tuple(shape)


def parse(raw: bytes, what: str = "safetensors", count: Callable[[bytes], object] | None = None) -> dict[str, Any]:
    """The header's bytes as a JSON object {name: entry} (`__metadata__` included, checked): UTF-8, no duplicate
    keys. `count`, where given, sees the bytes before anything is built (the audit bounds a header's JSON values
    there)."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise BadRequest(f"{what}: duplicate keys in the header")
        return dict(pairs)

    try:
        text = raw.decode("utf-8")
        if count is not None:
            count(raw)
        header = json.loads(text, object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(f"{what}: header is not valid UTF-8 JSON") from None
    header = json_object(header, f"{what}: header")
    metadata = header.get("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise BadRequest(f"{what}: __metadata__ must map strings to strings")
    return header


def entries(header: Mapping[str, Any], data_len: int | None, what: str = "safetensors",
            bits: Mapping[str, int] = CODEC_BITS) -> tuple[dict[str, Entry], int]:
    """The tensors of a parsed header (`parse`), each checked, in header order, and the end of the bytes they tile.

    `data_len`: the data section's size; None where it is not known yet (a body read as it streams, without a
    Content-Length): offsets are then bounded by 2**63 and the caller checks the end returned against the size
    once it is known (`covered`). `bits`: the dtype codes accepted, in bits per element.
    """
    out: dict[str, Entry] = {}
    for tensor, info in header.items():
        if tensor == "__metadata__":
            continue
        out[tensor] = _entry(tensor, info, data_len, what, bits)
    end = _tiled(out, what)
    if data_len is not None:
        covered(end, data_len, what)
    return out, end


def covered(end: int, data_len: int, what: str = "safetensors") -> None:
    """The tensors tile the data section to its end: `end` (what `entries` returned) is its size."""
    if end != data_len:
        raise BadRequest(f"{what}: the tensors cover {end} bytes but the data section has {data_len}")


def _entry(tensor: str, info: Any, data_len: int | None, what: str, bits: Mapping[str, int]) -> Entry:
    name = shown(tensor)
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise BadRequest(f"{what}: tensor {name} needs exactly dtype, shape and data_offsets")
    code = info["dtype"]
    if not isinstance(code, str) or code not in bits:
        raise BadRequest(f"{what}: tensor {name} has dtype {shown(code)}; accepted: " + ", ".join(bits))
    shape = checked_shape(info["shape"], f"{what}: tensor {name}")
    offsets, limit = info["data_offsets"], (1 << 63) - 1 if data_len is None else data_len
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(type(n) is int and 0 <= n <= limit for n in offsets) or offsets[0] > offsets[1]):
        bound = "< 2**63" if data_len is None else f"<= {data_len} (the data size)"
        raise BadRequest(f"{what}: tensor {name} data_offsets {shown(offsets)} must be [begin, end] "
                         f"with 0 <= begin <= end {bound}")
    begin, end = offsets
    size = math.prod(shape) * bits[code]
    if size % 8:
        raise BadRequest(f"{what}: tensor {name}: shape {list(shape)} of {code} is {size} bits, not a whole "
                         "number of bytes")
    if end - begin != size // 8:
        raise BadRequest(f"{what}: tensor {name} spans {end - begin} bytes but shape {list(shape)} of {code} "
                         f"needs {size // 8}")
    return Entry(code, shape, begin, end)


def _tiled(tensors: Mapping[str, Entry], what: str) -> int:
    """Offsets sorted by start run from 0 contiguously (the format forbids holes and overlaps); their end."""
    position = 0
    for tensor, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != position:
            problem = "overlaps the previous tensor" if entry.begin < position else "leaves a hole before it"
            raise BadRequest(f"{what}: tensor {shown(tensor)} starts at byte {entry.begin}, which {problem} "
                             f"(expected {position})")
        position = entry.end
    return position
