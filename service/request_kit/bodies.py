"""Request bodies read within a bound: 413 as soon as a body is known to be too large, never held in full.

`read_body` collects a body of at most `limit` bytes (a declared Content-Length is checked before
anything is read; a chunked body is counted as it arrives); `read_aligned_body` reads an inference
body into one buffer placed so that its binary tensors are aligned for numpy; `declared_length` is
what a body will take, for reserving memory before it is read. A client that goes away is a 499.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import numpy as np
from starlette.requests import ClientDisconnect

from posenc.service.errors import BadRequest, ClientClosedRequest, PayloadTooLarge, echo

# The scope extension by which posenc's server (`posenc.service.http.protocol`) reads a request body straight into a
# handler's buffer: `await scope["extensions"][RECEIVE_INTO](view)` -> bytes received (-1: more than `view`).
RECEIVE_INTO = "posenc.receive_into"
ReceiveInto = Callable[[memoryview], Awaitable[int]]


def receive_into_of(scope: Any) -> ReceiveInto | None:
    """The server's RECEIVE_INTO of this request, if it has one (not under another server or a test client)."""
    extensions = scope.get("extensions") or {}
    receive: ReceiveInto | None = extensions.get(RECEIVE_INTO)
    return receive


def declared_length(content_length: str | None, limit: int) -> int:
    """Bytes a body will take: its Content-Length when that is a valid number within `limit`, else `limit`
    (a chunked or lying body is cut at the limit anyway)."""
    if content_length is not None and content_length.isascii() and content_length.isdigit():
        return min(int(content_length), limit)
    return limit


# Where an inference body's binary section starts is known from its headers before any byte is read: the
# buffer is placed so that offset lands on this boundary, and numpy views of the tensors are aligned.
ALIGNMENT = 64


def _declared(content_length: str | None, limit: int) -> int | None:
    """The Content-Length as an integer (None: chunked); 400 when it is not a number, 413 over `limit`."""
    if content_length is None:
        return None
    if not (content_length.isascii() and content_length.isdigit()):
        raise BadRequest(f"Content-Length {echo(content_length)} is not an integer")
    if len(content_length) > 18:  # no body is this large (and int() refuses 4,300 digits and more)
        raise PayloadTooLarge(_too_large(10**18, limit, at_least=True))
    declared = int(content_length)
    if declared > limit:
        raise PayloadTooLarge(_too_large(declared, limit))
    return declared


async def read_body(content_length: str | None, chunks: AsyncIterable[bytes], limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit` bytes.

    A declared Content-Length is checked before reading anything; a chunked body is counted as it
    arrives, so an over-long upload is never held in memory in full. (Inference bodies, the large
    ones, are read by `read_aligned_body` into one buffer instead.)
    """
    _declared(content_length, limit)
    parts: list[bytes] = []
    received = 0
    try:
        async for chunk in chunks:
            received += len(chunk)
            if received > limit:
                raise PayloadTooLarge(_too_large(received, limit, at_least=True))
            parts.append(chunk)
    except ClientDisconnect:
        raise ClientClosedRequest(f"the client disconnected after {received} bytes of the body") from None
    return b"".join(parts)


async def read_aligned_body(content_length: str | None, chunks: AsyncIterable[bytes], limit: int,
                            align_at: int, receive_into: ReceiveInto | None = None) -> memoryview:
    """The request body in one buffer sized from Content-Length, each chunk copied into place as it arrives
    (no list of chunks joined afterwards), with `read_body`'s limits: 413 over `limit` (a declared length
    before anything is read), 400 for a body longer or shorter than its Content-Length, 499 when the
    client goes away. The buffer is placed so that byte `align_at` of the body sits on an ALIGNMENT-byte
    boundary: numpy views of binary tensors after a JSON header of that length need no copy. A chunked
    body (no Content-Length) grows one bytearray and is not aligned. With `receive_into` (the server's
    RECEIVE_INTO) a body with a Content-Length is copied into the buffer by the server as it is parsed, and
    `chunks` is not read."""
    buffer, start, size = await _read(content_length, chunks, limit, align_at=align_at, receive_into=receive_into)
    return buffer[start:start + size]




async def _read(content_length: str | None, chunks: AsyncIterable[bytes], limit: int, align_at: int,
                receive_into: ReceiveInto | None = None) -> tuple[memoryview, int, int]:
    """(buffer, start, size): the body is buffer[start:start + size]."""
    declared = _declared(content_length, limit)
    received = 0
    try:
        if declared is None:
            buffer = bytearray()
            async for chunk in chunks:
                received += len(chunk)
                if received > limit:
                    raise PayloadTooLarge(_too_large(received, limit, at_least=True))
                buffer += chunk
            return memoryview(buffer), 0, received
        pad = ALIGNMENT if declared else 0
        array = np.empty(declared + pad, np.uint8)  # not zeroed: every byte of the body is written
        start = (-(array.ctypes.data + align_at)) % ALIGNMENT if pad else 0
        with array.data as view:
            if receive_into is None:
                received = await _copy_chunks(chunks, view[start:start + declared])
            else:
                received = await receive_into(view[start:start + declared])
                if received < 0:
                    raise BadRequest(f"the request body is longer than its Content-Length ({declared} bytes)")
    except ClientDisconnect:
        raise ClientClosedRequest(f"the client disconnected before the end of the body ({received} bytes read)"
                                  ) from None
    if received != declared:
        raise BadRequest(f"the request body ended after {received} of the {declared} bytes of its Content-Length")
    return array.data, start, declared


async def _copy_chunks(chunks: AsyncIterable[bytes], view: memoryview) -> int:
    """Copy the chunks to `view`, refusing more than it holds (its Content-Length); the bytes received."""
    received = 0
    try:
        async for chunk in chunks:
            end = received + len(chunk)
            if end > len(view):
                raise BadRequest(f"the request body is longer than its Content-Length ({len(view)} bytes)")
            view[received:end] = chunk
            received = end
    except ClientDisconnect:
        raise ClientClosedRequest(f"the client disconnected after {received} bytes of the body") from None
    return received


def _too_large(size: int, limit: int, at_least: bool = False) -> str:
    return (f"the request body is {'at least ' if at_least else ''}{size} bytes; the limit for this endpoint "
            f"is {limit} bytes (at most POSENC_MAX_REQUEST_BYTES)")
