"""The connection protocol of `posenc serve`: the request timeouts and limits uvicorn lacks, bodies read
into the application's buffer, response bytes held in the memory budget until sent.

uvicorn bounds only an idle kept-alive connection (`timeout_keep_alive`) and, when asked, the drain after
a signal (`timeout_graceful_shutdown`). Left alone, a client that opens a connection and sends nothing, or
half a request head, or half a body, holds a connection (and during shutdown, the whole process) for as
long as it likes. `TimeoutHttpToolsProtocol` adds, on uvicorn's httptools protocol (the one uvicorn picks
when httptools is installed, which `uvicorn[standard]` guarantees):

* a head timer (`POSENC_HEADER_TIMEOUT`): from connection open, or from the end of the previous response,
  the next request head must be complete in time, else the connection is closed (slowloris);
* a body gap timer (`POSENC_BODY_TIMEOUT`): while a body is read, two chunks may be at most that far apart,
  else the client gets a 408 with the JSON error envelope (when nothing was answered yet) and the connection
  is closed; the application's `receive()` sees `http.disconnect` (its access log says 499);
* a head limit (`POSENC_MAX_HEADER_BYTES`): a request head (request line and headers) over it gets a 431
  with the JSON error envelope and the connection is closed, before the rest is read or buffered;
* a send timeout (`POSENC_SEND_TIMEOUT`): a response whose client stops reading (the write buffer stays
  full) for that long has its connection cut, and `posenc_send_timeouts_total` counts it;
* a body read into the application's buffer (`RECEIVE_INTO`, a scope extension): a handler that has one
  buffer for the whole body (an inference) gets every chunk copied there as it is parsed, with no pause of
  the socket at each 64 KiB and no ASGI message per chunk; the body timer and the limits stay as they are;
* bodies held until sent (`posenc.service.request_kit.sending`): a response registers the release of its memory
  budget reservation on the scope; the protocol calls it once the write buffer is empty after the response
  (the kernel has every byte) or the connection is lost. Until then the write buffer's limits are 0, so the
  transport tells the protocol (`resume_writing`) the moment it drains, and a client stalled on the last
  bytes meets the send timeout too;
* a shutdown deadline (`POSENC_GRACEFUL_SHUTDOWN_TIMEOUT`): after SIGTERM/SIGINT, a connection that still
  has a request in flight (a trickling upload, a download the client stopped reading) is aborted when the
  graceful timeout runs out, instead of keeping the process alive forever;
* a request's work stopped with its connection (`posenc.service.request_kit.work`): each request carries a `Work`
  in its scope, cancelled when the connection goes before the answer was sent (the client left, or one of the
  timers above cut it), which the request's CPU-bound work checks between its steps;
* a lingering close: an answer given before the request's body was read (a 413, a 503), on a connection that closes
  after it, is followed by the end of our side of the stream (FIN) while the rest of the body is read and dropped,
  for at most `LINGER_SECONDS` (a gap of `LINGER_GAP_SECONDS` with nothing) and `LINGER_BYTES`, as nginx's
  lingering_close does. Closed at once, the socket would hold unread bytes, and the kernel answers those with a
  reset that the client often meets before the answer (a client that sends its whole body before reading got a
  reset for half its refusals under load).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import uvicorn
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from posenc.service.errors import HeadersTooLarge, RequestTimeout
from posenc.service.http.metrics import count_send_timeout
from posenc.service.http.unix_socket import peer_of
from posenc.service.request_kit.bodies import RECEIVE_INTO
from posenc.service.request_kit.descriptors import DESCRIPTORS_SCOPE_KEY, PassedDescriptors
from posenc.service.request_kit.phases import HEAD_AT
from posenc.service.request_kit.sending import SEND_HOLD_SCOPE
from posenc.service.request_kit.unix import PEER_SCOPE_KEY, Peer
from posenc.service.request_kit.work import WORK_SCOPE, Work
from posenc.service.settings import Settings

log = logging.getLogger("posenc.http.server")

# A lingering close (see the module docstring) reads and drops at most this much of an unread body, for at most this
# long in all and this long without a byte; past them the connection is closed whatever the client still sends.
LINGER_BYTES = 64 * 1024 * 1024
LINGER_SECONDS = 30.0
LINGER_GAP_SECONDS = 5.0
LABEL_CHARACTERS = 200  # of a request's path in its work's name (the log lines of a shutdown)


@dataclass(frozen=True)
class Timeouts:
    keep_alive: float
    header: float
    body: float
    graceful_shutdown: float
    send: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> Timeouts:
        return cls(settings.timeout_keep_alive, settings.header_timeout, settings.body_timeout,
                   settings.graceful_shutdown_timeout, settings.send_timeout)


class ServerConfig(uvicorn.Config):
    """A uvicorn Config that carries posenc's timeouts and head limit to the protocol (pickled into workers)."""

    def __init__(self, app: Any, *, timeouts: Timeouts, max_header_bytes: int = 64 * 1024, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.timeouts = timeouts
        self.max_header_bytes = max_header_bytes


class DrainState(ServerState):
    """uvicorn's shared server state, plus how many connections the graceful timeout had to cut."""

    def __init__(self) -> None:
        super().__init__()
        self.cut_connections = 0


class HeadTooLargeError(Exception):
    """Raised from a parser callback to stop parsing a request head over POSENC_MAX_HEADER_BYTES."""


@dataclass(eq=False)
class BodySink:
    """Where the parser puts the body of `cycle`'s request while a handler waits in `receive_into`."""

    cycle: RequestResponseCycle
    view: memoryview
    received: int
    overflow: bool = False


def _cancel(handle: asyncio.TimerHandle | None) -> None:
    if handle is not None:
        handle.cancel()


class CloseAfterAnswer:
    """The transport as a request's cycle sees it: where uvicorn closes the connection after an answer, the protocol
    decides between closing it and a lingering close (`TimeoutHttpToolsProtocol.close_after_answer`); everything else
    is the transport's."""

    def __init__(self, transport: asyncio.Transport, protocol: TimeoutHttpToolsProtocol) -> None:
        self._transport, self._protocol = transport, protocol

    def close(self) -> None:
        self._protocol.close_after_answer()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class TimeoutHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head, body-gap and shutdown timers (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, server_state: ServerState, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        if not isinstance(config, ServerConfig):
            raise TypeError("TimeoutHttpToolsProtocol needs a posenc.service.serving.server.ServerConfig")
        self.timeouts = config.timeouts
        self.max_header_bytes = config.max_header_bytes
        self.head_bytes = 0  # bytes received while the current request's head is incomplete
        self.in_head = True  # the next bytes belong to a request head (not to a body)
        self.heads_completed = 0
        self.head_too_large = False
        # uvicorn's Config types it as whole seconds; its timer (loop.call_later) takes any float.
        self.timeout_keep_alive = config.timeouts.keep_alive  # type: ignore[assignment]
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None
        self.cut_timer: asyncio.TimerHandle | None = None
        self.send_timer: asyncio.TimerHandle | None = None
        self.peer: Peer | None = None  # set on the Unix socket: who connected (posenc.service.request_kit.unix)
        # set by the listener on the Unix socket: what came with the first bytes (for the first request only)
        self.passed_descriptors: PassedDescriptors | None = None
        self.sink: BodySink | None = None  # the body being read straight into a handler's buffer
        # releases of bodies not yet in the kernel: of the response being sent, of responses sent to the transport
        self.sending_holds: list[Callable[[], None]] = []
        self.sent_holds: list[Callable[[], None]] = []
        self.lost = False
        self.lingering = False  # the answer is sent and our side closed; the rest of the body is read and dropped
        self.linger_bytes = 0
        self.linger_deadline = 0.0
        self.linger_timer: asyncio.TimerHandle | None = None

    # -- head: a connection must not sit on an incomplete request head (or on nothing at all)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = peer_of(transport.get_extra_info("socket"))
        # uvicorn arms no timer on a fresh connection: one that never sends a byte would stay open forever.
        self.head_timer = self.loop.call_later(self.timeouts.header, self._head_timed_out)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            self._linger_on(len(data))
            return
        in_head, heads = self.in_head, self.heads_completed
        super().data_received(data)
        # httptools buffers a head until it is complete: counted here, chunk by chunk, it is cut at the limit
        # instead of growing for as long as the header timeout lets it. A chunk in which a head completed
        # (with its body, maybe a whole request) is not a head still growing.
        if in_head and self.heads_completed == heads and not self.transport.is_closing():
            self.head_bytes += len(data)
            if self.head_bytes > self.max_header_bytes:
                self._head_too_large()

    def send_400_response(self, msg: str) -> None:
        if self.head_too_large:  # the parser stopped on our HeadTooLargeError, not on bad HTTP
            self._head_too_large()
        else:
            super().send_400_response(msg)

    def _head_too_large(self) -> None:
        log.info("closing %s: request head over %d bytes (POSENC_MAX_HEADER_BYTES)", _peer(self.client),
                 self.max_header_bytes)
        message = (f"the request head (request line and headers) is over {self.max_header_bytes} bytes, the "
                   "most this server reads (POSENC_MAX_HEADER_BYTES)")
        self.transport.write(self._error_response(HeadersTooLarge.status_code, HeadersTooLarge.error_type, message))
        self.transport.close()

    def on_message_begin(self) -> None:
        self.in_head, self.head_bytes = True, 0
        super().on_message_begin()  # a fresh scope for this request
        if self.peer is not None:
            self.scope[PEER_SCOPE_KEY] = self.peer  # type: ignore[literal-required]
            if self.passed_descriptors is not None and self.heads_completed == 0:
                self.scope[DESCRIPTORS_SCOPE_KEY] = self.passed_descriptors  # type: ignore[literal-required]
        self.scope[SEND_HOLD_SCOPE] = self.hold_until_sent  # type: ignore[literal-required]

    def on_headers_complete(self) -> None:
        self.scope[HEAD_AT] = time.perf_counter()  # type: ignore[literal-required]  # where Server-Timing starts
        self.in_head = False
        self.heads_completed += 1
        # a head that arrived in one read was not counted as it grew: its size, from what was parsed
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_header_bytes:
            self.head_too_large = True
            raise HeadTooLargeError  # stops the parser: uvicorn then answers through send_400_response
        _cancel(self.head_timer)
        self.head_timer = None
        super().on_headers_complete()
        if not (self.parser.should_upgrade() and self._should_upgrade()):  # a WebSocket is not ours to time
            extensions: dict[Any, Any] = self.scope.setdefault("extensions", {})
            extensions[RECEIVE_INTO] = partial(self.receive_into, self.cycle)
            # (the request's task, just created, has not run yet: it sees both)
            path = str(self.scope.get("path", ""))
            self.scope[WORK_SCOPE] = Work(f"{self.scope.get('method')} {path[:LABEL_CHARACTERS]}")  # type: ignore[literal-required]
            self.cycle.transport = CloseAfterAnswer(self.transport, self)  # type: ignore[assignment]
            self._restart_body_timer()  # stopped by on_message_complete: at once when there is no body

    def on_response_complete(self) -> None:
        if self.lingering:  # no next request on this connection: only its count and the held bodies
            self.server_state.total_requests += 1
            self._release_sent()
            return
        super().on_response_complete()
        self._release_sent()
        if self.passed_descriptors is not None:  # only the first request could take them
            self.passed_descriptors.close()
        # No request in progress (a pipelined one may have started): the next head must come in time. An
        # idle connection is closed by the keep-alive timer first; the head deadline never undercuts it.
        if not self.transport.is_closing() and self.cycle.response_complete:
            _cancel(self.head_timer)
            timeout = max(self.timeouts.header, self.timeouts.keep_alive)
            self.head_timer = self.loop.call_later(timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if not self.transport.is_closing():
            log.debug("closing %s: no complete request head within %g s (POSENC_HEADER_TIMEOUT)",
                      _peer(self.client), self.timeouts.header)
            self.transport.close()

    # -- body: while a body is read, the client must keep sending

    def on_body(self, body: bytes) -> None:
        sink = self.sink
        if sink is not None and sink.cycle is self.cycle and not sink.cycle.response_complete:
            end = sink.received + len(body)
            if end > len(sink.view):  # cannot happen with Content-Length (the parser stops there): refused
                sink.overflow = True
                sink.cycle.message_event.set()
            elif not sink.overflow:
                sink.view[sink.received:end] = body
                sink.received = end
        else:
            super().on_body(body)
        self._restart_body_timer()

    async def receive_into(self, cycle: RequestResponseCycle, view: memoryview) -> int:
        """The rest of `cycle`'s request body copied into `view` as the parser meets it (the socket is not paused
        and no ASGI message is made per chunk); the bytes received. -1 when the body is longer than `view`;
        `ClientDisconnect` when the client went away (or the body timer gave up on it). The handler must not
        have called `receive()` for body bytes it wants here: those are gone."""
        if cycle.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            cycle.waiting_for_100_continue = False
        buffered = len(cycle.body)  # what arrived before the handler asked (uvicorn's buffer, at most ~64 KiB)
        if buffered > len(view):
            return -1
        view[:buffered] = cycle.body
        cycle.body = bytearray()
        sink = BodySink(cycle, view, buffered)
        self.sink = sink
        try:
            self.flow.resume_reading()
            while cycle.more_body and not sink.overflow:
                if cycle.disconnected or cycle.response_complete:
                    raise ClientDisconnect
                await cycle.message_event.wait()
                cycle.message_event.clear()
            if cycle.disconnected:
                raise ClientDisconnect
        finally:
            if self.sink is sink:
                self.sink = None
        return -1 if sink.overflow else sink.received

    def on_message_complete(self) -> None:
        self.in_head, self.head_bytes = True, 0  # what comes next is the head of the next request
        super().on_message_complete()
        _cancel(self.body_timer)
        self.body_timer = None

    def _restart_body_timer(self) -> None:
        _cancel(self.body_timer)
        self.body_timer = self.loop.call_later(self.timeouts.body, self._body_timed_out)

    def _body_timed_out(self) -> None:
        self.body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if self.flow.read_paused or cycle.waiting_for_100_continue:
            # The silence is ours: we stopped reading (the app has not consumed the buffered body yet, or a
            # pipelined request waits its turn), or the client waits for our `100 Continue`.
            self._restart_body_timer()
            return
        log.info("%s %s from %s: no body bytes for %g s (POSENC_BODY_TIMEOUT); closing the connection",
                 cycle.scope.get("method"), cycle.scope.get("path"), _peer(self.client), self.timeouts.body)
        self._cancel_work(f"its body stalled for {self.timeouts.body:g} s (POSENC_BODY_TIMEOUT)")
        half_answered = cycle.response_started and not cycle.response_complete
        if not cycle.response_started and not cycle.disconnected:
            self.transport.write(self._timeout_response())
        # The app's receive() now yields http.disconnect (a 499 in its log) and its send() is dropped.
        cycle.disconnected = True
        cycle.message_event.set()
        if half_answered:
            self.transport.abort()  # a response under way cannot be finished: do not wait to flush its start
        else:
            self.transport.close()  # flushes the 408 (or the complete answer) first

    def _timeout_response(self) -> bytes:
        return self._error_response(RequestTimeout.status_code, RequestTimeout.error_type,
                                    f"the request body stalled: no bytes arrived for "
                                    f"{self.timeouts.body:g} s (POSENC_BODY_TIMEOUT)")

    def _error_response(self, status: int, error_type: str, message: str) -> bytes:
        """A whole response with the JSON error envelope, closing the connection (written by the protocol)."""
        body = json.dumps({"error": message, "type": error_type}).encode()
        lines = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            lines += [name, b": ", value, b"\r\n"]
        lines += [b"content-type: application/json\r\n", b"content-length: %d\r\n" % len(body),
                  b"connection: close\r\n\r\n", body]
        return b"".join(lines)

    # -- sending: a client that stops reading is cut after the send timeout (its response holds memory)

    def pause_writing(self) -> None:
        super().pause_writing()  # the transport's write buffer is full: the client is not reading
        _cancel(self.send_timer)
        self.send_timer = self.loop.call_later(self.timeouts.send, self._send_timed_out)

    def resume_writing(self) -> None:
        super().resume_writing()
        _cancel(self.send_timer)
        self.send_timer = None
        self._release_sent()

    # -- bodies held until sent: their memory budget comes back when the kernel has every byte

    def hold_until_sent(self, release: Callable[[], None]) -> None:
        """Call `release` once the response being sent is in the kernel (or the connection is gone)."""
        if self.lost:
            release()
        else:
            self.sending_holds.append(release)

    def _release_sent(self) -> None:
        """Release what the responses written so far hold, if the kernel has all of it; else ask to be told."""
        if self.cycle is not None and self.cycle.response_complete:
            self.sent_holds += self.sending_holds
            self.sending_holds = []
        if not self.sent_holds or self.lost:
            return
        if self.transport.get_write_buffer_size() == 0:
            holds, self.sent_holds = self.sent_holds, []
            _release(holds)
            self.transport.set_write_buffer_limits()  # the defaults again
        else:
            # told (resume_writing) exactly when the buffer is empty; pauses now, which arms the send timer
            self.transport.set_write_buffer_limits(high=0, low=0)

    def _send_timed_out(self) -> None:
        # (also when the transport is closing: a close waits for the buffer to drain, which is what does not
        # happen; the keep-alive or head timer may have asked for that close already)
        self.send_timer = None
        log.info("cutting %s: it read nothing of its response for %g s (POSENC_SEND_TIMEOUT)", _peer(self.client),
                 self.timeouts.send)
        count_send_timeout()
        self._cancel_work(f"its client read nothing for {self.timeouts.send:g} s (POSENC_SEND_TIMEOUT)")
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.abort()  # close() would wait for the buffer to drain: that is what does not happen

    # -- shutdown: in-flight requests get the graceful timeout, then their connections are aborted

    def shutdown(self) -> None:
        if self.lingering:  # answered: only the drop of an unread body goes on, within the graceful timeout
            self._linger_until(min(self.linger_deadline, self.loop.time() + self.timeouts.graceful_shutdown))
            return
        super().shutdown()  # closes an idle connection; a busy one answers its request, then closes
        self.cut_timer = self.loop.call_later(self.timeouts.graceful_shutdown, self.cut)

    def cut(self) -> None:
        """Abort the connection: it still has a request in flight, or a response the client stopped reading."""
        _cancel(self.cut_timer)
        self.cut_timer = None
        if self.lingering:  # its answer was sent: nothing is cut
            self.transport.abort()
            return
        request = self._in_flight()
        log.warning("graceful shutdown timeout (%g s, POSENC_GRACEFUL_SHUTDOWN_TIMEOUT): aborting the "
                    "connection from %s with %s", self.timeouts.graceful_shutdown, _peer(self.client),
                    f"{request.label} in flight" if request is not None else "a response not yet sent")
        self._cancel_work(f"cut by the graceful shutdown timeout ({self.timeouts.graceful_shutdown:g} s, "
                          "POSENC_GRACEFUL_SHUTDOWN_TIMEOUT)")
        if isinstance(self.server_state, DrainState):
            self.server_state.cut_connections += 1
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.abort()  # close() would wait for the write buffer to drain: that may never happen

    # -- the work of a request whose connection is gone stops at its next check

    def _in_flight(self) -> Work | None:
        """The `Work` of the request being answered (None: none, or its answer is complete)."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return None
        work: Work | None = cycle.scope.get(WORK_SCOPE)  # type: ignore[assignment]
        return work

    def _cancel_work(self, reason: str) -> None:
        """Cancel the work of every request of this connection not answered yet (the current one, pipelined ones)."""
        cycles = [self.cycle, *(cycle for cycle, _ in self.pipeline)]
        for cycle in cycles:
            if cycle is not None and not cycle.response_complete:
                work = cycle.scope.get(WORK_SCOPE)
                if isinstance(work, Work):
                    work.cancel(reason)

    # -- lingering close: an answer given before the body was read reaches the client, not a reset

    def close_after_answer(self) -> None:
        """uvicorn's close after an answer on a connection that is not kept alive: a lingering close while the
        request's body is still arriving, else the close."""
        cycle = self.cycle
        if self.lingering or self.transport.is_closing():
            return
        if cycle is None or not cycle.response_complete or not cycle.more_body or cycle.disconnected \
                or not self.transport.can_write_eof():  # (an answer cut short is not one to deliver)
            self.transport.close()
            return
        self.lingering = True
        _cancel(self.body_timer)  # the body is no longer read for anyone: no 408
        self.body_timer = None
        self.transport.write_eof()  # the answer, then our FIN: the client reads it whenever it reads
        self.flow.resume_reading()
        self._linger_until(self.loop.time() + LINGER_SECONDS)

    def _linger_until(self, deadline: float) -> None:
        self.linger_deadline = deadline
        self._linger_on(0)

    def _linger_on(self, received: int) -> None:
        """`received` more bytes dropped: the close once a bound is passed, else the gap timer again."""
        self.linger_bytes += received
        _cancel(self.linger_timer)
        self.linger_timer = None
        left = self.linger_deadline - self.loop.time()
        if self.linger_bytes > LINGER_BYTES or left <= 0:
            self.transport.close()
            return
        self.linger_timer = self.loop.call_later(min(LINGER_GAP_SECONDS, left), self._linger_over)

    def _linger_over(self) -> None:
        self.linger_timer = None
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_work("its client left")  # (a timer that cut it gave its own reason first)
        for handle in (self.head_timer, self.body_timer, self.cut_timer, self.send_timer, self.linger_timer):
            _cancel(handle)
        self.head_timer = self.body_timer = self.cut_timer = self.send_timer = self.linger_timer = None
        self.lost = True
        if self.passed_descriptors is not None:
            self.passed_descriptors.close()
        holds, self.sending_holds, self.sent_holds = [*self.sending_holds, *self.sent_holds], [], []
        _release(holds)
        super().connection_lost(exc)


def _release(holds: list[Callable[[], None]]) -> None:
    for release in holds:
        release()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
