"""The numbers an audit reads from a file, checked in one place for every reader (GGUF, safetensors, ONNX, the
extract): counts and sizes are integers in [0, 2**63), scalars finite numbers, tensor shapes non-negative integer
dimensions whose product, computed with Python integers (never `np.prod`, which wraps), stays within a bound, and
the arrays that carry position facts have the ranks the audit reads. A value outside is a 400 naming the field,
what it was and what is allowed. JSON documents are counted (values, depth, entries) before they are parsed."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posenc.service.errors import BadRequest, PayloadTooLarge

INT_LIMIT = 1 << 63  # every count a file format can hold (GGUF's and ONNX's are 64-bit)
MAX_ELEMENTS = 1 << 62  # elements of any declared tensor: far beyond any file, within int64 byte sizes
MAX_LIST = 8  # entries of a list of sizes (M-RoPE sections, a learned table's shape)
# arrays that carry position facts, by the ranks they may have: a vector, or for inv_freq a [2, n] short/long pair
RANKS = {"inv_freq": (1, 2), "freq_factors": (1,), "long_factors": (1,), "short_factors": (1,), "alibi_slopes": (1,)}


def shown(value: Any, limit: int = 40) -> str:
    """`repr(value)` cut to `limit` characters (a 4,000-digit integer is named, not echoed)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(field: str, value: Any, minimum: int = 1) -> int | None:
    """An integer in [minimum, 2**63) (an integral float such as 4096.0 is taken as its integer); None stays None."""
    return None if value is None else _integer(field, value, minimum)


def _integer(field: str, value: Any, minimum: int) -> int:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not _is_int(value) or not minimum <= value < INT_LIMIT:
        raise BadRequest(f"{field} must be an integer in [{minimum}, 2**63), got {shown(value)}")
    return int(value)


def number(field: str, value: Any) -> float | None:
    """A finite number (an integer within float range included); None stays None."""
    if value is None:
        return None
    finite = (_is_int(value) and abs(value) <= sys.float_info.max) or (
        isinstance(value, float) and math.isfinite(value))
    if not finite:
        raise BadRequest(f"{field} must be a finite number, got {shown(value)}")
    return float(value)


def integers(field: str, value: Any, minimum: int = 0) -> tuple[int, ...]:
    """A list of at most MAX_LIST integers, each as `integer` checks it (M-RoPE sections, a learned table's shape)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) > MAX_LIST:
        raise BadRequest(f"{field} must be a list of at most {MAX_LIST} integers in [{minimum}, 2**63), got "
                         f"{shown(value)}")
    return tuple(_integer(f"{field}[{i}]", item, minimum) for i, item in enumerate(value))


def shape(field: str, dims: Any, limit: int = MAX_ELEMENTS) -> tuple[int, ...]:
    """A tensor shape: non-negative integer dimensions (at most 8) whose product is at most `limit`."""
    if isinstance(dims, str | bytes) or not isinstance(dims, Sequence) or len(dims) > MAX_LIST \
            or not all(_is_int(d) and d >= 0 for d in dims):
        raise BadRequest(f"{field} must be a list of at most {MAX_LIST} non-negative integer dimensions, got "
                         f"{shown(dims)}")
    elements = math.prod(int(d) for d in dims)
    if elements > limit:
        raise BadRequest(f"{field} {shown(list(dims))} declares {elements if elements < INT_LIMIT else 'over 2**63'}"
                         f" elements; at most {limit} are allowed")
    return tuple(int(d) for d in dims)


def position_shape(field: str, name: str, dims: tuple[int, ...]) -> None:
    """The shape of an array that carries position facts: non-empty, of a rank the audit reads (RANKS)."""
    ranks = RANKS[name]
    if len(dims) not in ranks or math.prod(dims) == 0 or (len(dims) == 2 and dims[0] != 2):
        raise BadRequest(f"{field} must be a non-empty vector" + (" or a [2, n] pair" if 2 in ranks else "")
                         + f", got shape {list(dims)}")


# JSON (a config.json, `?config=`, a safetensors header, the extract) is counted before `json.loads` builds it: a
# pass over its bytes with the strings taken out counts `{`, `[` and `,` (every value but the document itself
# follows a `,` or opens its container, so the count bounds the objects a parse builds) and, once that count is
# within bounds, the nesting depth and the entries of the top-level object. Linear in the bytes (one regular
# expression, a byte translation, a cumulative sum over the structure bytes left); 60 MiB of `[{},{},...]` would
# otherwise be 1.8 GB of dicts.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b"{}[],")))
_STEP = np.zeros(256, dtype=np.int8)
_STEP[list(b"{[")] = 1
_STEP[list(b"}]")] = -1


@dataclass(frozen=True)
class JsonLimits:
    """What a JSON document may hold: values (`{`, `[` and `,` outside strings), nesting levels, and entries of
    its top-level object (`entries` names them in a refusal)."""

    values: int
    depth: int
    members: int | None = None
    entries: str = "entries"


def _utf8(data: bytes) -> bytes:
    """The document as UTF-8 (where JSON's structure bytes are never part of a multi-byte character)."""
    encoding = json.detect_encoding(data)
    return data if encoding == "utf-8" else data.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")


def _skeleton(data: bytes) -> bytes:
    """The structure bytes (`{}[],`) outside strings, in order."""
    return _JSON_STRING.sub(b"", data).translate(None, _NOT_STRUCTURE)


def _too_many(what: str, limits: JsonLimits) -> PayloadTooLarge:
    return PayloadTooLarge(f"{what}: more than {limits.values} JSON values (counting `{{`, `[` and `,` outside "
                           "strings); a real file holds far fewer")


def _strings_within(data: bytes, what: str, limits: JsonLimits) -> None:
    """Before the strings are taken out (one regular expression match each): a document of at most `values`
    values holds at most 2 * values + 1 strings (a key and a value after each `{`, `[` or `,`), so 4 * values + 2
    quotes that no backslash escapes."""
    if data.count(b'"') - data.count(b'\\"') > 4 * limits.values + 2:
        raise _too_many(what, limits)


def _check_shape(skeleton: bytes, what: str, limits: JsonLimits) -> None:
    """Values first (what bounds the arrays below), then the closing brackets, the depth and the entries."""
    opens = skeleton.count(b"{") + skeleton.count(b"[")
    commas = skeleton.count(b",")
    if opens + commas > limits.values:
        raise _too_many(what, limits)
    if len(skeleton) - opens - commas > opens:
        raise BadRequest(f"{what}: not JSON (more closing brackets than opening ones)")
    codes = np.frombuffer(skeleton, dtype=np.uint8)
    depths = np.cumsum(_STEP[codes], dtype=np.int32)  # the nesting after each structure byte
    depth = int(depths.max(initial=0))
    if depth > limits.depth:
        raise BadRequest(f"{what}: JSON nested {depth} levels deep; at most {limits.depth} are read")
    members = int(np.count_nonzero(depths[codes == ord(",")] == 1)) + 1
    if limits.members is not None and members > limits.members:
        raise PayloadTooLarge(f"{what}: more than {limits.members} {limits.entries}")


def count_json(data: bytes, what: str, limits: JsonLimits) -> bytes:
    """`data` as UTF-8 once its values, depth and top-level entries are counted within `limits` (413 or 400 naming
    the limit passed, before anything is built); a ValueError where its encoding is not one JSON allows."""
    data = _utf8(data)
    _strings_within(data, what, limits)
    _check_shape(_skeleton(data), what, limits)
    return data


def json_document(data: bytes, what: str, limits: JsonLimits) -> Any:
    """`data` parsed as JSON once counted within `limits` (`count_json`); 400 when it is not JSON."""
    try:
        return json.loads(count_json(data, what, limits))
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BadRequest(f"{what}: not JSON") from None
