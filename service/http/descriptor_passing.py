"""Descriptor passing on the Unix socket (SCM_RIGHTS): the listener's peek at a new connection's first byte and
what came with it (`peek_descriptors`), and the client's side (`send_with_descriptors`). What the descriptors are
for, and who may take them: `posenc.service.request_kit.descriptors`."""

from __future__ import annotations

import array
import asyncio
import socket

from posenc.service.request_kit.descriptors import MAX_DESCRIPTORS, PassedDescriptors


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
