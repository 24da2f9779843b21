"""Bounded reading of a file's header and of a few byte ranges after it, from a local file or a request stream.

A header parser reads through a `Cursor` over the bytes received so far; when it needs more it raises
`NeedMore` with the total it needs, and the driver reads on (doubling, up to the header limit) and parses again.
The parsed header names the byte ranges it still needs (`Layout.ranges`, absolute offsets); a file is read there
with seeks, a stream is consumed and dropped up to each range, never held beyond the ranges.
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


class Cursor:
    """Little-endian reads over a byte buffer; past its end → NeedMore (or a 400 past `limit`)."""

    def __init__(self, data: bytes, limit: int, what: str) -> None:
        self.data, self.pos, self.limit, self.what = data, 0, limit, what
        self.items = 0  # entries a parser walked without keeping (bounded by the parser)

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > self.limit:
            raise PayloadTooLarge(f"{self.what}: the header is larger than {format_bytes(self.limit)} (it declares "
                                  f"{n} more bytes at offset {self.pos}); POSENC_AUDIT_MAX_HEADER_BYTES bounds it")
        if end > len(self.data):
            raise NeedMore(end)
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt)))[0]

    def room(self) -> int:
        """Bytes the header may still take."""
        return self.limit - self.pos


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


def read_file(handle: BinaryIO, size: int, parse: HeaderParser, limit: int, what: str
              ) -> tuple[Any, dict[str, bytes]]:
    """Parse the header of an open file, then read only the ranges it names (seeking past the rest)."""
    data = b""
    want = min(FIRST_READ, limit)
    while True:
        handle.seek(len(data))
        data += handle.read(max(0, min(want, size) - len(data)))
        try:
            layout = parse(Cursor(data, limit, what))
            break
        except NeedMore as more:
            if len(data) >= size:
                raise BadRequest(f"{what}: the file ends ({size} bytes) inside its header (it needs {more.needed} "
                                 "bytes): truncated") from None
            want = min(max(more.needed, 2 * len(data)), limit)
    _check_ranges(layout, size, what)
    out = {}
    for name, (offset, length) in layout.ranges.items():
        handle.seek(offset)
        out[name] = handle.read(length)
    return layout.header, out


async def read_stream(chunks: AsyncIterator[bytes], size: int | None, parse: HeaderParser, limit: int, what: str
                      ) -> tuple[Any, dict[str, bytes]]:
    """The same from a request body: the header is collected (up to `limit`), then the body is consumed and
    dropped but for the named ranges; reading stops after the last one."""
    buffer = bytearray()
    want = min(FIRST_READ, limit)
    ended = False
    layout = None
    while layout is None:
        while len(buffer) < want and not ended:
            try:
                buffer += await chunks.__anext__()
            except StopAsyncIteration:
                ended = True
        try:
            layout = parse(Cursor(bytes(buffer), limit, what))
        except NeedMore as more:
            if ended:
                raise BadRequest(f"{what}: the body ends ({len(buffer)} bytes) inside its header (it needs "
                                 f"{more.needed} bytes): truncated") from None
            want = min(max(more.needed, 2 * len(buffer)), limit)
    _check_ranges(layout, size, what)
    return layout.header, await _collect(chunks, bytes(buffer), ended, layout.ranges, what)


async def _collect(chunks: AsyncIterator[bytes], head: bytes, ended: bool, ranges: Mapping[str, tuple[int, int]],
                   what: str) -> dict[str, bytes]:
    pending = sorted(ranges.items(), key=lambda item: item[1][0])
    out: dict[str, bytearray] = {name: bytearray() for name in ranges}
    position = 0
    chunk = head
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
