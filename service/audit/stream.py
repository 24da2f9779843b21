"""Bounded reading of a file's header and of a few byte ranges after it, from a local file or a request stream,
and the two sources the readers take (`Source`: `FileSource`, `UploadSource`).

A header parser reads through a `Cursor` and parses the header once, from its start to its end. Over a local file
the cursor reads on as the parser needs (doubling, up to the header limit). Over a request stream the bytes at
hand are parsed in a worker thread (the event loop answers meanwhile); a parser that needs more raises `NeedMore`
with the total it needs (a safetensors header declares its length; a GGUF header asks for everything up to the
limit, since it declares none), the driver reads that much once and parses again: at most twice, the first time
over the first 64 KiB. The parsed header names the byte ranges it still needs (`Layout.ranges`, absolute offsets);
a file is read there with seeks, a stream is consumed and dropped up to each range, never held beyond the ranges.
A header that fixes the file's size (a safetensors file's tensors tile its data to its end) is checked against
the size the cursor knows (a file's, an upload's Content-Length); a body sent without one is consumed to its end
(and dropped) to check it.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar

from posenc.service.errors import BadRequest, PayloadTooLarge, format_bytes

T = TypeVar("T")
InThread = Callable[..., Awaitable[Any]]  # `await in_thread(call, *args)`: call(*args) on a worker thread


class NeedMore(Exception):
    """The header continues past the bytes received: `needed` bytes from the start are required."""

    def __init__(self, needed: int) -> None:
        super().__init__(needed)
        self.needed = needed


Fill = Callable[[bytearray, int], None]  # extends the buffer to hold at least the given total, or raises


class Cursor:
    """Little-endian reads over a byte buffer; past its end, `fill` reads on (without one: NeedMore); past `limit`
    a 413. `size`: the bytes of the whole file, where known (a file's; an upload's Content-Length)."""

    def __init__(self, data: bytearray, limit: int, what: str, fill: Fill | None = None,
                 size: int | None = None) -> None:
        self.data, self.pos, self.limit, self.what, self.fill, self.size = data, 0, limit, what, fill, size
        self.items = 0  # strings a parser walked or kept (bounded by the parser)

    def reach(self, end: int) -> None:
        """Make the bytes up to `end` available: within the limit, read on or NeedMore."""
        if end > self.limit:
            raise PayloadTooLarge(f"{self.what}: the header is larger than {format_bytes(self.limit)} (it declares "
                                  f"{end - self.pos} more bytes at offset {self.pos}); POSENC_AUDIT_MAX_HEADER_BYTES "
                                  "bounds it (`posenc audit --max-header-bytes`)")
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
    # where the header fixes the file's size: a check of the size of a body read without one (a 400 if it differs)
    check_size: Callable[[int], None] | None = None


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
    layout = parse(Cursor(bytearray(), limit, what, _file_fill(handle, size, limit, what), size))
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


async def read_stream(chunks: AsyncIterator[bytes], size: int | None, parse: HeaderParser, limit: int, what: str,
                      in_thread: InThread) -> tuple[Any, dict[str, bytes]]:
    """The same from a request body: the first 64 KiB are parsed in a worker thread (`in_thread`); a header that
    needs more is read up to what it asks for (at least twice the bytes at hand, within `limit`) and parsed again.
    The body is then consumed and dropped but for the named ranges; reading stops after the last one (without a
    declared size, where the header fixes it, at the body's end)."""
    buffer = bytearray()
    want = min(FIRST_READ, limit)
    while True:
        ended = await _read_to(chunks, buffer, want)
        try:
            layout = await in_thread(parse, Cursor(buffer, limit, what, size=size))
            break
        except NeedMore as more:
            if ended:
                raise BadRequest(f"{what}: the body ends ({len(buffer)} bytes) inside its header (it needs "
                                 f"{more.needed} bytes): truncated") from None
            want = min(max(more.needed, 2 * len(buffer)), limit)
    _check_ranges(layout, size, what)
    tensors, position, ended = await _collect(chunks, buffer, ended, layout.ranges, what)
    if size is None and layout.check_size is not None:
        while not ended:  # the bytes are counted and dropped, one chunk at a time
            try:
                position += len(await chunks.__anext__())
            except StopAsyncIteration:
                ended = True
        layout.check_size(position)
    return layout.header, tensors


async def _collect(chunks: AsyncIterator[bytes], head: bytearray, ended: bool, ranges: Mapping[str, tuple[int, int]],
                   what: str) -> tuple[dict[str, bytes], int, bool]:
    """The bytes of each range, then the bytes of the body seen so far and whether it has ended."""
    pending = sorted(ranges.items(), key=lambda item: item[1][0])
    out: dict[str, bytearray] = {name: bytearray() for name in ranges}
    position = 0
    chunk: bytes | bytearray = head
    while True:  # the head first, whatever the ranges: its bytes count in the position
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
    return {name: bytes(value) for name, value in out.items()}, position, ended


class Source(Protocol):
    """A bounded byte source, what every reader takes (`posenc.service.audit.readers`): a local file
    (`FileSource`) or a request body (`UploadSource`). `kind` (the format, "gguf", "onnx", ...) names the file
    in refusals."""

    @property
    def folder(self) -> Path | None:
        """Where an ONNX model's external data lies: a local file's folder; None for an upload."""
        ...

    async def start(self, n: int) -> bytes:
        """The first `n` bytes (fewer when the source is shorter); a reader still reads from the start."""
        ...

    async def header(self, parse: HeaderParser, kind: str) -> tuple[Any, dict[str, bytes]]:
        """The header parsed within POSENC_AUDIT_MAX_HEADER_BYTES, then only the byte ranges it names
        ({name: bytes})."""
        ...

    async def whole(self, kind: str) -> bytes:
        """Every byte, within POSENC_AUDIT_MAX_ONNX_BYTES (413 beyond)."""
        ...

    async def compute(self, call: Callable[..., T], *args: Any) -> T:
        """`call(*args)` where a reader's parse runs: a worker thread for an upload (the event loop answers
        meanwhile), the calling thread for a file."""
        ...


FILE_NAMES = {"gguf": "GGUF"}  # how a refusal names a local file of each kind ("GGUF file", "safetensors file")
_NOT_REGULAR = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}


def open_regular(path: Path) -> BinaryIO:
    """`path` open for reading, when it is a regular file (a symbolic link is followed: its target must be one). The
    open does not block, so a FIFO is refused rather than waited on; a FIFO, a device (/dev/zero never ends), a socket
    or a directory is a 400 naming what it is. OSError where it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            target = os.path.realpath(path)
            named = f"{path} (-> {target})" if os.path.islink(path) else str(path)
            raise BadRequest(f"{named} is {_NOT_REGULAR.get(stat.S_IFMT(mode), 'not a file')}: posenc audit reads "
                             "regular files only")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_within(handle: BinaryIO, path: Path, limit: int) -> bytes:
    """A local file's bytes from its start, at most `limit` (413 beyond, before anything is read where its size
    says so): a file that grows meanwhile, or whose size says 0 (/proc), is read to limit + 1 bytes at most."""
    size, more = os.fstat(handle.fileno()).st_size, ""
    if size <= limit:
        handle.seek(0)
        body = handle.read(limit + 1)
        if len(body) <= limit:
            return body
        size, more = len(body), " or more"
    raise PayloadTooLarge(f"{path}: {format_bytes(size)}{more}, over the {format_bytes(limit)} an ONNX or JSON file "
                          "is read within (POSENC_AUDIT_MAX_ONNX_BYTES; raise it with `posenc audit --max-onnx-bytes "
                          "BYTES`)")


def read_regular(path: Path, limit: int) -> bytes:
    """A regular file's bytes, within `limit` (`open_regular`, `read_within`)."""
    with open_regular(path) as handle:
        return read_within(handle, path, limit)


class FileSource:
    """A local file (`posenc audit`), open for reading (`open_regular`): a header read on as its parser needs, then
    its ranges by seeking; or the file whole within `whole_limit`. Its coroutines never wait on anything (the command
    line has no event loop to keep free)."""

    def __init__(self, handle: BinaryIO, path: Path, header_limit: int, whole_limit: int) -> None:
        self.handle, self.path, self.folder = handle, path, path.parent
        self.header_limit, self.whole_limit = header_limit, whole_limit
        self.size = os.fstat(handle.fileno()).st_size

    async def start(self, n: int) -> bytes:
        self.handle.seek(0)
        return self.handle.read(n)

    async def header(self, parse: HeaderParser, kind: str) -> tuple[Any, dict[str, bytes]]:
        return read_file(self.handle, self.size, parse, self.header_limit, f"{FILE_NAMES.get(kind, kind)} file")

    async def whole(self, kind: str) -> bytes:
        return read_within(self.handle, self.path, self.whole_limit)

    async def compute(self, call: Callable[..., T], *args: Any) -> T:
        return call(*args)


class UploadSource:
    """A request body (`POST /v1/audit`) of `size` bytes (its Content-Length; None: not declared): a header parsed
    in worker threads (`in_thread`: the server's audit threads, else anyio's) as the bytes arrive, then the body
    consumed and dropped up to each range; or the body held whole within `whole_limit`."""

    folder: None = None

    def __init__(self, chunks: AsyncIterator[bytes], size: int | None, header_limit: int, whole_limit: int,
                 in_thread: InThread | None = None) -> None:
        from starlette.concurrency import run_in_threadpool  # the server's threads: the CLI never comes here

        self.chunks, self.size, self.header_limit, self.whole_limit = chunks, size, header_limit, whole_limit
        self.in_thread = in_thread or run_in_threadpool
        self.first = b""  # the bytes `start` read, handed on first

    async def start(self, n: int) -> bytes:
        while len(self.first) < n:
            try:
                self.first += await self.chunks.__anext__()
            except StopAsyncIteration:
                break
        return self.first[:n]

    async def _body(self) -> AsyncIterator[bytes]:
        """The body from its start: the bytes `start` read, then the rest."""
        if self.first:
            yield self.first
        async for chunk in self.chunks:
            yield chunk

    async def header(self, parse: HeaderParser, kind: str) -> tuple[Any, dict[str, bytes]]:
        return await read_stream(self._body(), self.size, parse, self.header_limit, f"{kind} upload", self.in_thread)

    async def whole(self, kind: str) -> bytes:
        limit = self.whole_limit
        if self.size is not None and self.size > limit:
            raise PayloadTooLarge(f"a {kind} upload of {format_bytes(self.size)} is over POSENC_AUDIT_MAX_ONNX_BYTES "
                                  f"({format_bytes(limit)}); audit it with `posenc audit FILE --remote URL`, which "
                                  "sends only the extract")
        body = bytearray()
        async for chunk in self._body():
            body += chunk
            if len(body) > limit:
                raise PayloadTooLarge(f"a {kind} upload over {format_bytes(limit)} (POSENC_AUDIT_MAX_ONNX_BYTES); "
                                      "audit it with `posenc audit FILE --remote URL`, which sends only the extract")
        return bytes(body)  # the bytearray goes with this frame: one copy held while it is parsed

    async def compute(self, call: Callable[..., T], *args: Any) -> T:
        result: T = await self.in_thread(call, *args)
        return result
