"""Large KServe JSON tensor data, read and written without a Python object per number for the whole tensor.

Parsing a JSON infer body whole (`pydantic_core.from_json`) makes a Python float (24 bytes) and a list slot
(8 bytes) per number before numpy sees them: 32 bytes for every 4 to 20 bytes of text, so a 64 MiB body of
`"data":[0.5,...]` grew the process by 886 MB. Here, a body of at least `LIFT_MIN_BYTES`:

* `lift_data`: each flat numeric `"data": [...]` list of at least `SPAN_MIN_BYTES` is cut out of the JSON
  text, which is parsed with a short placeholder string in its place;
* `span_array`: the list's text is parsed `CHUNK_BYTES` at a time (the same parser, so the same numbers and
  the same strictness) into one array of the input's datatype, with the element count, datatype and range
  rules of the generic path (`posenc.service.inference.codecs.kserve_request._json_data`).

Anything this does not reproduce exactly raises `Fallback`, and the caller parses the body the generic way:
a JSON syntax error (so its message is the parser's own, at its place in the whole body), a list of a
datatype it leaves to the generic path (BOOL, integers beyond int64, integers over 2**24 in a float
datatype). So answers and error messages are those of the generic path; only the memory differs.

`json_data` writes an array as the JSON `data` list of the response the same way: `CHUNK_NUMBERS` numbers
at a time through the same encoder (`pydantic_core.to_json` of `posenc.service.codec.encode.json_values`), so the
text is byte-identical to encoding the whole list at once; Python objects exist for one chunk at a time.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import pydantic_core

from posenc.models.dtypes import BY_KSERVE, cast
from posenc.service.codec.encode import json_values
from posenc.service.errors import BadRequest, ClientClosedRequest

LIFT_MIN_BYTES = 1 << 20  # bodies smaller than this are parsed whole: their objects are few
SPAN_MIN_BYTES = 64 << 10  # lists shorter than this stay in the JSON text
CHUNK_BYTES = 1 << 18  # text parsed at once: about 25,000 to 65,000 numbers
CHUNK_NUMBERS = 1 << 14  # numbers written at once
EXACT_INTEGER = 1 << 24  # integers above this in a float datatype: the generic path's rounding, not ours



@functools.cache
def _liftable(min_bytes: int) -> re.Pattern[bytes]:
    """A flat numeric `data` list of at least `min_bytes`, closed. The possessive `{n,}+` never gives back what
    it matched: a run of number characters is read once, and the search goes on after it whatever follows."""
    return re.compile(rb'"data"\s*:\s*\[([0-9eE+\-.,\s]{%d,}+)\]' % min_bytes)


# Set around a parse by the route that runs it (copied into the worker thread with the context): whether the
# client has left, so that nobody's body is parsed for nobody.
CLIENT_GONE: ContextVar[Callable[[], bool] | None] = ContextVar("posenc_client_gone", default=None)


def stop_if_client_gone() -> None:
    """499 (`ClientClosedRequest`) when the client of the request being parsed has left."""
    gone = CLIENT_GONE.get()
    if gone is not None and gone():
        raise ClientClosedRequest("the client closed the connection while its body was parsed")


class Fallback(Exception):
    """This body (or list) is for the generic parser: it alone gives the exact answer or error."""


@dataclass(frozen=True)
class Span:
    """The text of one lifted `data` list, without its brackets: `body[start:end]` (a view of the request)."""

    body: memoryview
    start: int
    end: int

    def pieces(self) -> Iterator[tuple[int, bytes]]:
        """(offset, text) of the span, about `CHUNK_BYTES` at a time (copies of that size only)."""
        for offset in range(self.start, self.end, CHUNK_BYTES):
            yield offset, bytes(self.body[offset:min(offset + CHUNK_BYTES, self.end)])

    def find_comma(self, start: int) -> int:
        """Where the first comma at or after `start` is, or -1."""
        for offset, piece in Span(self.body, start, self.end).pieces():
            at = piece.find(b",")
            if at >= 0:
                return offset + at
        return -1


def lift_data(body: memoryview) -> tuple[bytes | None, dict[str, Span]]:
    """The JSON text with each large flat numeric `data` list replaced by a placeholder string, and the lists
    (views of `body`) by placeholder. No list lifted: None and {}. (Positions in the text differ from the
    body's: a syntax error is reported by the generic path, on the body.)

    One pass of one regular expression (`_liftable`): each `"data": [` is followed to the first character
    that is no part of a number, and the list is lifted when that is its `]`; lists nested, holding strings,
    booleans or nulls, short or never closed stay in place. No byte is read more than twice, however the
    body is made. Stops with a 499 between two lists once the client has left (`CLIENT_GONE`)."""
    spans: dict[str, Span] = {}
    parts: list[bytes] = []
    position = 0
    nonce = os.urandom(8).hex()
    for match in _liftable(SPAN_MIN_BYTES).finditer(body):
        stop_if_client_gone()
        start, end = match.span(1)
        token = f"posenc-data-{nonce}-{len(spans)}"
        spans[token] = Span(body, start, end)
        parts += [bytes(body[position:start - 1]), f'"{token}"'.encode()]
        position = end + 1
    if not spans:
        return None, {}
    parts.append(bytes(body[position:]))
    return b"".join(parts), spans


def span_array(span: Span, datatype: str, shape: tuple[int, ...], where: str) -> np.ndarray:
    """The lifted list as an array of `shape` and `datatype`; the generic path's 400s; `Fallback` where the
    generic path must answer."""
    dtype = BY_KSERVE[datatype].numpy
    if dtype.kind not in "iuf" and datatype != "BF16":  # BOOL: numbers are not its data (the generic 400)
        raise Fallback
    expected = math.prod(shape)
    count = sum(piece.count(b",") for _, piece in span.pieces()) + 1
    if count != expected:
        check_syntax(span)  # the generic path reports the count of a list that parses
        raise BadRequest(f"{where}: 'data' has {count} elements, shape {list(shape)} needs {expected}")
    out = np.empty(expected, dtype)  # [N], filled chunk by chunk
    integers = dtype.kind in "iu"
    out_of_range = False
    position = 0
    for values in _Chunks(span):
        if values.dtype.kind != "i" and (integers or values.dtype.kind != "f"):
            raise Fallback  # floats in integer data (the generic message names the first), ints beyond int64
        if integers:
            info = np.iinfo(dtype)
            out_of_range |= bool(values.size) and (values.min() < info.min or values.max() > info.max)
        elif values.dtype.kind == "i":
            if values.size and np.abs(values).max() > EXACT_INTEGER:
                raise Fallback
            values = values.astype(np.float64)  # exact: as the generic path's float64 list, or its int64 cast
        if not out_of_range:
            out[position:position + values.size] = cast(values, dtype)
        position += values.size
    if out_of_range:
        raise BadRequest(f"{where}: 'data' has values outside the {datatype} range")
    return out.reshape(shape)  # [shape], row-major as sent


def check_syntax(span: Span) -> None:
    """Parse the span and drop the numbers: `Fallback` if it is not a valid JSON list."""
    for _ in _Chunks(span):
        pass


class _Chunks:
    """The span's numbers, `CHUNK_BYTES` of text at a time (cut after a comma), each chunk an array as numpy
    makes it of the parsed list."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.position = span.start

    def __iter__(self) -> _Chunks:
        return self

    def __next__(self) -> np.ndarray:
        body, end = self.span.body, self.span.end
        if self.position > end:
            raise StopIteration
        stop_if_client_gone()
        limit = self.position + CHUNK_BYTES
        cut = self.span.find_comma(limit) if limit < end else -1
        stop = end if cut < 0 else cut
        try:
            numbers = pydantic_core.from_json(b"".join((b"[", body[self.position:stop], b"]")))
            values = np.array(numbers)
        except (ValueError, OverflowError):
            raise Fallback from None  # not JSON (the generic parser names the place), or beyond numpy
        if not numbers:
            raise Fallback  # "[1,]" or "[ ]": an empty chunk is a syntax error, or a list the count got wrong
        self.position = stop + 1
        return values


def json_data(array: np.ndarray) -> bytearray:
    """The JSON `data` list of `array` (flat, row-major; non-finite floats as "NaN", "Infinity", "-Infinity"),
    byte-identical to `pydantic_core.to_json(json_values(array))`."""
    flat = array.reshape(-1)
    out = bytearray(b"[")
    for start in range(0, flat.size, CHUNK_NUMBERS):
        if start:
            out += b","
        out += memoryview(pydantic_core.to_json(json_values(flat[start:start + CHUNK_NUMBERS])))[1:-1]
    out += b"]"
    return out


def splice(header: bytes, lists: Mapping[str, np.ndarray]) -> list[bytes | bytearray]:
    """`header` (JSON text holding each key of `lists` as a string) as parts with the arrays' `json_data` in
    place of those strings."""
    parts: list[bytes | bytearray] = []
    position = 0
    for token, array in lists.items():
        quoted = pydantic_core.to_json(token)
        at = header.index(quoted, position)
        parts += [header[position:at], json_data(array)]
        position = at + len(quoted)
    parts.append(header[position:])
    return parts


def placeholder(index: int, nonce: str) -> str:
    """A string no client can have written into a response header: where `splice` puts a data list."""
    return f"posenc-json-data-{nonce}-{index}"
