"""Descriptors a Unix-socket client passes with its request (SCM_RIGHTS), for `fd:` shared-memory regions.

A client hands the server an object it holds (a memfd) by sending the descriptor itself, as ancillary data
of the first bytes of a new connection (`socket.send_fds`); the kernel gives the server its own descriptor
of the same open file, with the access the client opened it with. The server never looks a descriptor up
by the client's pid (`/proc/<pid>/fd/N`): that pid may belong to another process by then.

The event loop's transport reads with plain `recv`, which drops ancillary data, so the listener peeks at a
Unix connection's first byte with `recvmsg` before the transport takes the socket (`peek_descriptors`).
What came with it belongs to the connection's first request (`PassedDescriptors`, in its scope under
`DESCRIPTORS_SCOPE_KEY`): a register with an `fd:` key takes it; whatever is not taken is closed when that
request is answered or the connection ends. At most `MAX_DESCRIPTORS` per connection; more is refused.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
from dataclasses import dataclass, field

DESCRIPTORS_SCOPE_KEY = "posenc.passed_descriptors"
MAX_DESCRIPTORS = 1


@dataclass(eq=False)
class PassedDescriptors:
    """The descriptors that came with a connection's first bytes; `refused` when the client sent more than
    `MAX_DESCRIPTORS` (the extra ones were never installed, and none is kept)."""

    fds: list[int] = field(default_factory=list)
    refused: bool = False

    def take(self) -> int | None:
        """The passed descriptor, now the caller's to close; None when none is left."""
        return self.fds.pop(0) if self.fds else None

    def close(self) -> None:
        """Close what was not taken."""
        fds, self.fds = self.fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _received(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return list(fds)


def peek_at_descriptors(sock: socket.socket) -> PassedDescriptors | None:
    """The descriptors attached to the next unread byte of `sock` (the byte stays unread); None when nothing
    has arrived yet (EAGAIN)."""
    try:
        data, ancillary, flags, _ = sock.recvmsg(1, socket.CMSG_SPACE(MAX_DESCRIPTORS * 4),
                                                 socket.MSG_PEEK | socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
    except (BlockingIOError, InterruptedError):
        return None
    passed = PassedDescriptors(_received(ancillary))
    if flags & socket.MSG_CTRUNC:  # more than MAX_DESCRIPTORS: the kernel kept the rest; keep none
        passed.close()
        passed.refused = True
    del data
    return passed


async def peek_descriptors(sock: socket.socket, timeout: float) -> PassedDescriptors | None:
    """Wait (at most `timeout`) for the first byte of a new Unix connection, and take the descriptors that
    came with it. None when the client sent nothing in time (the connection is not worth a transport)."""
    loop = asyncio.get_running_loop()
    passed = peek_at_descriptors(sock)
    if passed is not None:
        return passed
    readable = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await asyncio.wait_for(readable, timeout)
    except TimeoutError:
        return None
    finally:
        loop.remove_reader(sock.fileno())
    return peek_at_descriptors(sock) or PassedDescriptors()


def send_with_descriptors(sock: socket.socket, data: bytes, fds: list[int]) -> None:
    """Send `data` on a connected Unix socket with `fds` attached to its first bytes (the client's side)."""
    sent = socket.send_fds(sock, [data], fds)
    if sent < len(data):
        sock.sendall(data[sent:])
