"""Listening sockets that accept every waiting connection each time the event loop looks at them.

Under uvloop, libuv accepts one connection per event-loop iteration (libuv pull request 3696, 2022), and
relies on the listener staying readable for the next. A loop under full load can take tens of milliseconds
per iteration (dozens of connections parsed and answered in each), so a burst of new connections waits in
the kernel's accept queue, one iteration each: at 45 ms per iteration a queue of 60 is 2.7 s old before it
is accepted. Such a client sees a server that does not answer, and its timers (the head timeout, the drain
after SIGTERM) start only when it is finally accepted. asyncio's own loop accepts a batch per readiness;
`Listener` does the same under either loop, and hands each socket to `loop.connect_accepted_socket`.

Only the single-process server uses it. With several workers, uvicorn's workers share one listening socket,
and one connection per iteration is what spreads connections between them.

On a Unix socket, a connection is handed over once its first byte has arrived (within the header timeout),
with the descriptors the client attached to that byte (`posenc.service.request_kit.descriptors`): the transport
would drop them.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable
from typing import Any

from posenc.service.http.descriptor_passing import peek_descriptors
from posenc.service.request_kit.descriptors import PassedDescriptors

log = logging.getLogger("posenc.http.server")

# Connections accepted per readiness of the listener: what waits in the queue of a busy loop, without
# starving the connections already open (the listener is still readable after it if more wait).
ACCEPT_BATCH = 128
# Out of descriptors or memory: the listener rests this long (asyncio's ACCEPT_RETRY_DELAY) instead of
# failing on every iteration; waiting connections stay in the kernel's queue meanwhile.
RESOURCE_PAUSE_SECONDS = 1.0
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class Listener:
    """One listening socket whose waiting connections are accepted in batches.

    It offers what `posenc.service.serving.server.Server` uses of an `asyncio.Server`: `sockets` and `close()`.
    """

    def __init__(self, sock: socket.socket, protocol_factory: Callable[[], asyncio.Protocol], backlog: int,
                 loop: asyncio.AbstractEventLoop, first_byte_timeout: float = 30.0) -> None:
        sock.setblocking(False)
        self.first_byte_timeout = first_byte_timeout
        sock.listen(backlog)
        self.sockets = [sock]
        self.sock, self.protocol_factory, self.loop = sock, protocol_factory, loop
        self.connecting: set[asyncio.Task[None]] = set()  # transports being made for accepted sockets
        self.peeking: set[asyncio.Task[Any] | None] = set()  # of those, Unix ones waiting for their first byte
        self.closed = False
        self.resume_handle: asyncio.TimerHandle | None = None
        loop.add_reader(sock.fileno(), self.accept_waiting)

    def accept_waiting(self) -> None:
        """Accept what waits (at most `ACCEPT_BATCH`); each becomes a transport and a protocol."""
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    log.warning("accepting a connection failed (%s); the listener pauses %g s",
                                exc.strerror, RESOURCE_PAUSE_SECONDS)
                    self.loop.remove_reader(self.sock.fileno())
                    self.resume_handle = self.loop.call_later(RESOURCE_PAUSE_SECONDS, self._resume)
                    return
                continue  # the connection was gone before it was accepted (ECONNABORTED and the like)
            conn.setblocking(False)
            task = self.loop.create_task(self._connect(conn))
            self.connecting.add(task)
            task.add_done_callback(self.connecting.discard)

    async def _connect(self, conn: socket.socket) -> None:
        passed: PassedDescriptors | None = None
        try:
            factory = self.protocol_factory
            if conn.family == socket.AF_UNIX:
                task = asyncio.current_task()
                self.peeking.add(task)
                try:
                    passed = await peek_descriptors(conn, self.first_byte_timeout)
                finally:
                    self.peeking.discard(task)
                if passed is None:  # nothing sent within the header timeout, as the protocol's head timer
                    conn.close()
                    return
                factory = _with_descriptors(self.protocol_factory, passed)
            await self.loop.connect_accepted_socket(factory, conn)
        except (OSError, asyncio.CancelledError) as exc:  # reset before the transport, or the listener closed
            log.debug("an accepted connection failed before it was set up: %s", exc)
            if passed is not None:
                passed.close()
            conn.close()

    def _resume(self) -> None:
        self.resume_handle = None
        if not self.closed:
            self.loop.add_reader(self.sock.fileno(), self.accept_waiting)

    def close(self) -> None:
        """Stop accepting and close the listening socket (connections already accepted stay open)."""
        if self.closed:
            return
        self.closed = True
        if self.resume_handle is not None:
            self.resume_handle.cancel()
        else:
            self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for task in list(self.peeking):  # Unix connections that sent nothing yet: closed like idle ones
            if task is not None:
                task.cancel()


def _with_descriptors(factory: Callable[[], asyncio.Protocol],
                      passed: PassedDescriptors) -> Callable[[], asyncio.Protocol]:
    def create() -> asyncio.Protocol:
        protocol = factory()
        if hasattr(protocol, "passed_descriptors"):
            protocol.passed_descriptors = passed
        else:
            passed.close()
        return protocol
    return create
