"""Bounded reading of a file's header and of a few byte ranges after it, from a local file or a request stream.

A header parser reads through a `Cursor` and parses the header once, from its start to its end. Over a local file
the cursor reads on as the parser needs (doubling, up to the header limit). Over a request stream the bytes at
hand are parsed in a worker thread (the event loop answers meanwhile); a parser that needs more raises `NeedMore`
with the total it needs (a safetensors header declares its length; a GGUF header asks for everything up to the
limit, since it declares none), the driver reads that much once and parses again: at most twice, the first time
over the first 64 KiB. The parsed header names the byte ranges it still needs (`Layout.ranges`, absolute offsets);
a file is read there with seeks, a stream is consumed and dropped up to each range, never held beyond the ranges.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from posenc.service.errors import BadRequest, PayloadTooLarge, format_bytes


class NeedMore(Exception):
    """The header continues past the bytes received: `needed` bytes from the start are required."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


Fill = Callable[[bytearray, int], None]  # extends the buffer to hold at least the given total, or raises


class Cursor:
    """Little-endian reads over a byte buffer; past its end, `fill` reads on (without one: NeedMore); past `limit`
    a 413."""

    def __init__(self, data: bytearray, limit: int, what: str, fill: Fill | None = None) -> None:
        self.data, self.pos, self.limit, self.what, self.fill = data, 0, limit, what, fill
        self.items = 0  # strings a parser walked or kept (bounded by the parser)

    def reach(self, end: int) -> None:
        """Make the bytes up to `end` available: within the limit, read on or NeedMore."""
        if end > self.limit:
            raise PayloadTooLarge(f"{self.what}: the header is larger than {format_bytes(self.limit)} (it declares "
                                  f"{end - self.pos} more bytes at offset {self.pos}); POSENC_AUDIT_MAX_HEADER_BYTES "
                                  "bounds it")
        if end > len(self.data):
            if self.fill is None:
                raise NeedMore(end)
            self.fill(self.data, end)

    def take(self, n: int) -> bytes:
        if n < 0:
            raise BadRequest(f"{self.what}: a negative size at offset {self.pos}")
        end = self.pos + n
        self.reach(end)
        out = bytes(self.data[self.pos:end])
        self.pos = end
        return out

    def skip(self, n: int) -> None:
        """Past `n` bytes the parser does not keep (they must be there all the same)."""
        self.reach(self.pos + n)
        self.pos += n

    def unpack(self, fmt: str) -> Any:
        layout = _STRUCTS.get(fmt) or _STRUCTS.setdefault(fmt, struct.Struct("<" + fmt))
        self.reach(self.pos + layout.size)
        value = layout.unpack_from(self.data, self.pos)[0]
        self.pos += layout.size
        return value

    def room(self) -> int:
        """Bytes the header may still take."""
        return self.limit - self.pos


_STRUCTS: dict[str, struct.Struct] = {}


@dataclass
class Layout:
    """A parsed header: what it says (`header`) and the byte ranges still needed {name: (offset, length)}."""

    header: Any
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    extent: int = 0  # bytes the file must hold for every tensor it declares


HeaderParser = Callable[[Cursor], Layout]
FIRST_READ = 1 << 16


def _check_ranges(layout: Layout, size: int | None, what: str) -> None:
    if size is not None and layout.extent > size:
        raise BadRequest(f"{what}: its tensors' data ends at byte {layout.extent}, past the end of the file "
                         f"({size} bytes): the file is truncated or its offsets or sizes lie")
    for name, (offset, length) in layout.ranges.items():
        if offset < 0 or length < 0:
            raise BadRequest(f"{what}: tensor {name} has a negative offset or size")
        if size is not None and offset + length > size:
            raise BadRequest(f"{what}: tensor {name}'s data ({length} bytes at offset {offset}) ends past the end "
                             f"of the file ({size} bytes): the file is truncated or its offsets lie")


def _file_fill(handle: BinaryIO, size: int, limit: int, what: str) -> Fill:
    """Reads on from a file, at least doubling the bytes held each time (within the limit and the file)."""

    def fill(data: bytearray, end: int) -> None:
        want = min(max(end, 2 * len(data), FIRST_READ), limit, size)
        handle.seek(len(data))
        data += handle.read(max(0, want - len(data)))
        if len(data) < end:
            raise BadRequest(f"{what}: the file ends ({size} bytes) inside its header (it needs {end} bytes): "
                             "truncated")

    return fill


def read_file(handle: BinaryIO, size: int, parse: HeaderParser, limit: int, what: str
              ) -> tuple[Any, dict[str, bytes]]:
    """Parse the header of an open file once, reading on as it needs, then read only the ranges it names."""
    layout = parse(Cursor(bytearray(), limit, what, _file_fill(handle, size, limit, what)))
    _check_ranges(layout, size, what)
    out = {}
    for name, (offset, length) in layout.ranges.items():
        handle.seek(offset)
        out[name] = handle.read(length)
    return layout.header, out


async def _read_to(chunks: AsyncIterator[bytes], buffer: bytearray, want: int) -> bool:
    """Read into `buffer` until it holds `want` bytes; True when the body ended first."""
    while len(buffer) < want:
        try:
            buffer += await chunks.__anext__()
        except StopAsyncIteration:
            return True
    return False


async def read_stream(chunks: AsyncIterator[bytes], size: int | None, parse: HeaderParser, limit: int, what: str
                      ) -> tuple[Any, dict[str, bytes]]:
    """The same from a request body: the first 64 KiB are parsed in a worker thread; a header that needs more is
    read up to what it asks for (at least twice the bytes at hand, within `limit`) and parsed again. The body is
    then consumed and dropped but for the named ranges; reading stops after the last one."""
    from starlette.concurrency import run_in_threadpool  # the server's threads: the CLI never comes here

    buffer = bytearray()
    want = min(FIRST_READ, limit)
    while True:
        ended = await _read_to(chunks, buffer, want)
        try:
            layout = await run_in_threadpool(parse, Cursor(buffer, limit, what))
            break
        except NeedMore as more:
            if ended:
                raise BadRequest(f"{what}: the body ends ({len(buffer)} bytes) inside its header (it needs "
                                 f"{more.needed} bytes): truncated") from None
            want = min(max(more.needed, 2 * len(buffer)), limit)
    _check_ranges(layout, size, what)
    return layout.header, await _collect(chunks, buffer, ended, layout.ranges, what)


async def _collect(chunks: AsyncIterator[bytes], head: bytearray, ended: bool, ranges: Mapping[str, tuple[int, int]],
                   what: str) -> dict[str, bytes]:
    pending = sorted(ranges.items(), key=lambda item: item[1][0])
    out: dict[str, bytearray] = {name: bytearray() for name in ranges}
    position = 0
    chunk: bytes | bytearray = head
    while pending:
        end = position + len(chunk)
        for name, (offset, length) in pending:
            lo, hi = max(offset, position), min(offset + length, end)
            if lo < hi:
                out[name] += chunk[lo - position:hi - position]
        pending = [(n, r) for n, r in pending if len(out[n]) < r[1]]
        position = end
        if not pending:
            break
        if ended:
            missing = ", ".join(n for n, _ in pending)
            raise BadRequest(f"{what}: the body ends at byte {position} before the data of {missing}: truncated")
        try:
            chunk = await chunks.__anext__()
        except StopAsyncIteration:
            ended, chunk = True, b""
    return {name: bytes(value) for name, value in out.items()}
