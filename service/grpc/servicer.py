"""`inference.GRPCInferenceService`: the KServe v2 / Triton gRPC methods, an adapter over the data plane
(`posenc.service.inference.dataplane`) that the HTTP routes use too.

Each method checks its protocol group (`posenc.service.request_kit.restricted.PROTOCOL_GROUPS`; the header of
POSENC_RESTRICTED_API travels as call metadata, once: a key sent twice is INVALID_ARGUMENT, as HTTP's 400), asks the
plane, and answers a `ServiceError` with the gRPC status the taxonomy's table gives its HTTP status (`grpc_status`)
and the same message. Every call is recorded (metrics by method and code, the access log).
Methods posenc does not serve (model load and unload, CUDA shared memory, trace and log settings) answer
UNIMPLEMENTED, as the generated base class does.

Limits (`admit`, `admit_stream`): POSENC_GRPC_MAX_CONCURRENT_RPCS calls at once, of which streams may hold at
most `stream_cap` (three quarters), so streams cannot take the places of unary calls; health and metadata calls
(`UNLIMITED_GROUPS`) are never counted nor refused. A stream that sends nothing for POSENC_GRPC_STREAM_IDLE_SECONDS
while none of its requests is in progress ends DEADLINE_EXCEEDED, giving its place back.

Messages (`receive`, a stream's reader): an inference message is asked of gRPC core only once the data plane's
admission step (`DataPlane.admitted`, the one HTTP takes before reading a body) has passed: some model ready and
taking requests, and the memory the message may bring in (`RECEIVE_COPIES` x POSENC_MAX_REQUEST_BYTES: gRPC core
tells nothing of a message before it is whole, and once asked it takes the whole message) reserved in the budget.
That reservation is lent (`Reservation.lend`): a call whose message has not come `RECLAIM_SECONDS` after it was asked
(a stream: `STREAM_RECLAIM_SHARE` of POSENC_MEMORY_WAIT_SECONDS after its last answer was written) gives it to whoever
waits for memory, and ends RESOURCE_EXHAUSTED. So a call that sends nothing holds nothing that others need.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, NoReturn, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message
from tritonclient.grpc import service_pb2 as pb

from posenc.service.budget import (
    RELEASE_AFTER_BYTES,
    Reservation,
    holds_more_free_than,
    kept_bound,
    release_free_memory,
)
from posenc.service.errors import (
    INTERNAL_MESSAGE,
    BadRequest,
    Forbidden,
    RequestTimeout,
    ServiceError,
    Unavailable,
    echo,
    grpc_code_name,
    grpc_details,
)
from posenc.service.inference.codecs.kserve_request import InferRequest
from posenc.service.inference.codecs.protobuf import (
    RawInputs,
    decode_infer_request,
    decoded_bytes,
    encode_infer_response,
    model_config_message,
    model_metadata_message,
    repository_index_message,
    shared_memory_status_message,
    split_infer_request,
    statistics_message,
    stream_response,
)
from posenc.service.inference.dataplane import Admitted, Buffer, DataPlane, offload, work
from posenc.service.inference.runtime.repository import VERSION
from posenc.service.inference.shared_memory.registry import RegionsFor
from posenc.service.request_kit import phases
from posenc.service.request_kit.restricted import (
    METHOD_GROUPS,
    SHARED_MEMORY_GROUP,
    SharedMemoryCaller,
    duplicate_key_message,
    repeated_key,
    restricted_message,
)

log = logging.getLogger("posenc.grpc")

SERVICE = "inference.GRPCInferenceService"
RETRY_AFTER_KEY = "retry-after"  # trailing metadata: seconds, as HTTP's Retry-After
STREAM_WINDOW = 8  # requests of one stream in progress at once; more wait unread (back-pressure)
PARSE_COPIES = 3  # a message being parsed: its bytes and their copies (`GrpcInferCall.reserve_bytes`), as over HTTP
WRITE_COPIES = 2  # a stream's answer being written: its bytes and gRPC's copy of them, held until written
# A message being received: gRPC core's buffer and the bytes it hands over, both whole at that moment. Its size is
# unknown until it has arrived, so its read holds this many times POSENC_MAX_REQUEST_BYTES (lent: `RECLAIM_SECONDS`).
RECEIVE_COPIES = 2
DRAINING = "the server is shutting down: this stream has every answer written; open a new stream (another replica)"
DRAIN_CHECK_SECONDS = 0.5  # how often a stream waiting for its client's next request looks whether the server drains
# Once the server drains, a stream with every answer written ends when its client has sent nothing for this long: a
# client still writing is served on (ended under a write, a stream ends INTERNAL on the client, grpc/grpc#36066)
DRAIN_QUIET_SECONDS = 1.0
# Once the server drains, a unary call whose message has not arrived gets this share of the graceful timeout for it,
# then ends UNAVAILABLE (a call that sends nothing is not cut at the timeout, which exits 1)
DRAIN_RECEIVE_SHARE = 0.5
UNSENT_AT_DRAIN = ("the server is shutting down: the request message had not arrived {seconds:g} s after the drain "
                   "began; retry (another replica)")
# A unary call's message is handed to the client's gRPC core with the call (its first 64 KiB are in the server's before
# posenc asks for it), so once asked it arrives at the speed of its link. One not in this long after it was asked,
# while others wait for memory, loses the memory held for it; at most half of POSENC_MEMORY_WAIT_SECONDS, so that those
# waiting get it before their own wait ends.
RECLAIM_SECONDS = 1.0
# A stream's next request comes when its client's program writes it: a stream whose answers are all written loses
# that memory after this share of POSENC_MEMORY_WAIT_SECONDS (ended while its client still writes, a stream ends
# INTERNAL on the client, grpc/grpc#36066: a slow client is given the time)
STREAM_RECLAIM_SHARE = 0.5
# The leading fields of a ModelInferRequest read before it is parsed (`leading_names`): model_name, model_version, id
LEADING_FIELDS = (1, 2, 3)
NAME_LIMIT = 1024  # bytes of a leading field read on the event loop; a longer one waits for the parse
# A message being received must arrive within POSENC_BODY_TIMEOUT plus a second per MiB of POSENC_MAX_REQUEST_BYTES
# (its size is unknown until then): a slow sender holds the read's reservation that long at most, while a server
# slowed by its own load (reads wait on its threads too) does not cut its clients.
RECEIVE_BYTES_PER_SECOND = 1 << 20
# The methods that read their own message (registered with a request iterator): it is read under the budget.
READ_UNDER_BUDGET = frozenset({"ModelInfer"})
# Groups whose methods are never refused by the call limit: they answer at once from memory (no queue, no
# await), and a probe must get through however many calls and streams are open.
UNLIMITED_GROUPS = frozenset({"health", "metadata"})
UNARY_SHARE = 4  # 1/UNARY_SHARE of POSENC_GRPC_MAX_CONCURRENT_RPCS (rounded down) is never given to streams
# The health service names of the whole server (`server.health_statuses`): open to a probe without metadata
# (the kubelet's gRPC probe sends none); a model's name follows the `health` group's restriction.
SERVER_HEALTH_NAMES = frozenset({"", SERVICE})

Recorder = Callable[[str, str, float, int, str], None]  # (method, code name, seconds, response bytes, peer)
T = TypeVar("T")
M = TypeVar("M", bound=Message)


def grpc_status(exc: ServiceError) -> tuple[grpc.StatusCode, tuple[tuple[str, str], ...]]:
    """The status code of a service error (the taxonomy's table, `posenc.service.errors.grpc_code_name`), and its
    trailing metadata (the retry hint of a 503)."""
    retry = exc.headers.get("Retry-After") if isinstance(exc, Unavailable) else None
    return grpc.StatusCode[grpc_code_name(exc)], ((RETRY_AFTER_KEY, retry),) if retry else ()


def grpc_failure(exc: ServiceError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """What a call that failed with `exc` is aborted with: its status (`grpc_status`), its message cut to what a
    client takes in its metadata (`posenc.service.errors.grpc_details`), its trailing metadata."""
    status, trailing = grpc_status(exc)
    return status, grpc_details(exc.message), trailing


def _carries(metadata: Mapping[str, str | bytes], restriction: tuple[str, str]) -> bool:
    value = metadata.get(restriction[0])
    if value is None:
        return False
    raw = value if isinstance(value, bytes) else value.encode()
    return hmac.compare_digest(raw, restriction[1].encode())


def _parsed(message: type[Message], data: bytes, parse: Callable[[bytes], T]) -> T:
    """`parse(data)`; 400 (INVALID_ARGUMENT) naming `message` when the bytes are not one."""
    try:
        return parse(data)
    except (DecodeError, RuntimeWarning, ValueError) as exc:
        raise BadRequest(f"malformed {message.DESCRIPTOR.full_name} message ({len(data)} bytes): {exc}") from None


def decode(message: type[M], data: bytes) -> M:
    """A request message from its bytes; 400 (INVALID_ARGUMENT) when they are not one."""
    return _parsed(message, data, message.FromString)


InferMessage = tuple[pb.ModelInferRequest, RawInputs]  # the message without its raw inputs, and those
Names = tuple[str, str, str]  # a ModelInferRequest's model_name, model_version and id


def decode_infer(data: bytes) -> InferMessage:
    """A `ModelInferRequest` from its bytes, its `raw_input_contents` as views of them (`split_infer_request`);
    400 (INVALID_ARGUMENT) when they are not one, as `decode`."""
    return _parsed(pb.ModelInferRequest, data, split_infer_request)


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at `position` (at most 10 bytes) and the position after it; ValueError past the end."""
    value = 0
    for shift in range(0, 70, 7):
        byte = data[position]  # IndexError past the end
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
    raise ValueError("varint longer than 10 bytes")


def leading_names(data: bytes) -> Names | None:
    """The model's name and version and the request's id of a ModelInferRequest when they lead its bytes, as
    protobuf encoders write them (fields in number order): the data plane admits the request to its model before
    the message is parsed. None when the name does not lead (the message is parsed first), when a leading field is
    longer than `NAME_LIMIT` or not text. Reads at most the three fields."""
    found: dict[int, str] = {}
    position = 0
    try:
        while position < len(data) and len(found) < len(LEADING_FIELDS):
            tag, position = _varint(data, position)
            field = tag >> 3
            if field not in LEADING_FIELDS or tag & 7 != 2 or field in found:
                break
            length, position = _varint(data, position)
            if length > NAME_LIMIT or position + length > len(data):
                return None
            found[field] = data[position:position + length].decode()
            position += length
    except (IndexError, ValueError):  # (UnicodeDecodeError is a ValueError)
        return None
    if 1 not in found:
        return None
    return found[1], found.get(2, ""), found.get(3, "")


class Servicer:
    """The methods, each `(request, caller) -> response`; `server` wraps them (`unary`, `stream`) with the
    decoding, the protocol group check, the error mapping and the record."""

    def __init__(self, plane: DataPlane, record: Recorder) -> None:
        self.plane, self.record = plane, record
        self.restrictions = plane.settings.restrictions()
        self.keys = frozenset(header for header, _ in self.restrictions.values())  # metadata names, lower case
        self.active = 0  # calls in progress, streams included (POSENC_GRPC_MAX_CONCURRENT_RPCS bounds them)
        self.streams = 0  # streams in progress (`stream_cap` bounds them)
        self.freed: asyncio.Event | None = None  # set when a call ends (for streams waiting for a place)
        # the server drains (SIGTERM, `drain`): a stream with every answer written and a quiet client, or a unary call
        # whose message has not come, ends UNAVAILABLE rather than be cut at the graceful timeout
        self.draining = False
        self.drain_waiters: set[asyncio.Future[None]] = set()  # `_drain_cut`s waiting for the drain
        self.drain_receive_seconds = DRAIN_RECEIVE_SHARE * plane.settings.graceful_shutdown_timeout
        # what glibc's heaps may keep of freed memory by the settings (`receive` trims past it)
        self.kept_bytes = kept_bound(plane.settings.malloc_arenas, plane.settings.malloc_keep_bytes)

    def drain(self, grace: float) -> None:
        """The server drains, its calls given `grace` seconds: streams waiting for a quiet client and messages not
        yet arrived are ended before the calls still running are cut."""
        self.draining, self.drain_receive_seconds = True, DRAIN_RECEIVE_SHARE * grace
        for waiter in self.drain_waiters:
            _settle(waiter)

    async def _drain_cut(self) -> None:
        """Returns `drain_receive_seconds` after the drain began."""
        if not self.draining:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.drain_waiters.add(waiter)
            try:
                await waiter
            finally:
                self.drain_waiters.discard(waiter)
        await asyncio.sleep(self.drain_receive_seconds)

    @property
    def stream_cap(self) -> int:
        """Streams in progress at once: the call limit less the share kept for unary calls."""
        limit = self.plane.settings.grpc_max_concurrent_rpcs
        return limit - limit // UNARY_SHARE

    def admit(self) -> None:
        """One more unary call in progress, or RESOURCE_EXHAUSTED with a retry hint when the limit is reached."""
        limit = self.plane.settings.grpc_max_concurrent_rpcs
        if self.active >= limit:
            raise Unavailable(f"busy: {self.active} gRPC calls in progress (POSENC_GRPC_MAX_CONCURRENT_RPCS={limit}); "
                              "retry later", retry_after=1, overloaded=True)
        self.active += 1

    async def admit_stream(self) -> None:
        """One more stream in progress, once there is room among the calls and among the streams (`stream_cap`):
        a stream refused while its client still writes would end as INTERNAL on the client, so it waits, unread
        (its deadline still applies)."""
        while self.active >= self.plane.settings.grpc_max_concurrent_rpcs or self.streams >= self.stream_cap:
            if self.freed is None:
                self.freed = asyncio.Event()
            await self.freed.wait()
        self.active += 1
        self.streams += 1

    def leave_stream(self) -> None:
        self.streams -= 1
        self.leave()

    def leave(self) -> None:
        self.active -= 1
        if self.freed is not None:
            self.freed.set()  # every waiter re-checks; the next call to find it full waits on a fresh event
            self.freed = None

    # -- what every call goes through

    def metadata(self, context: grpc.aio.ServicerContext) -> dict[str, str | bytes]:
        """The call's metadata by lower-case name; 400 (INVALID_ARGUMENT) naming a restriction's key sent more
        than once (HTTP refuses it too: which copy would count differs between libraries)."""
        pairs = list(context.invocation_metadata() or ())
        repeated = repeated_key((key for key, _ in pairs), self.keys)
        if repeated is not None:
            raise BadRequest(duplicate_key_message(repeated))
        return {key.lower(): value for key, value in pairs}

    def require(self, group: str, path: str, metadata: Mapping[str, str | bytes]) -> None:
        """403 (PERMISSION_DENIED) when `group` is restricted and the call lacks its header."""
        if group in self.restrictions and not _carries(metadata, self.restrictions[group]):
            raise Forbidden(restricted_message(path, group, self.restrictions[group][0]))

    async def guard_health(self, path: str, service: str, context: grpc.aio.ServicerContext) -> None:
        """`grpc.health.v1.Health` (`path`: its method) asked about `service`: a model's name follows the
        `health` group's restriction, as ModelReady does; the server's names (`SERVER_HEALTH_NAMES`) stay open to
        probes that send no metadata. A key sent twice is refused either way. Aborts the call when refused."""
        try:
            metadata = self.metadata(context)
            if service not in SERVER_HEALTH_NAMES:
                self.require("health", f"{path} (service '{service}')", metadata)
        except ServiceError as exc:
            await context.abort(*grpc_failure(exc))

    def caller(self, method: str, metadata: Mapping[str, str | bytes]) -> SharedMemoryCaller:
        """403 for a restricted method without its header; the shared-memory caller (over gRPC: never a
        Unix-socket peer, so only the shared-memory key lets it use shared memory)."""
        group = METHOD_GROUPS.get(method)
        if group is not None:
            self.require(group, f"/{SERVICE}/{method}", metadata)
        key = self.restrictions.get(SHARED_MEMORY_GROUP)
        return SharedMemoryCaller(None, key is not None and _carries(metadata, key))

    def unary(self, method: str, request_type: type[M],
              handle: Callable[..., Awaitable[Message | bytes]]
              ) -> Callable[..., Awaitable[bytes]]:
        """The handler of a unary method: request bytes in, response bytes out (`handle` gets the request, the
        caller and the request's size, and answers a message or its serialized bytes). ModelInfer's request is
        its bytes (the data plane admits it to its model before it is parsed), every other one the message."""
        read: Callable[[bytes], Any] | None = None if method == "ModelInfer" else partial(decode, request_type)
        timing = self.plane.settings.server_timing
        limited = METHOD_GROUPS.get(method) not in UNLIMITED_GROUPS

        async def handler(message: bytes | AsyncIterator[bytes] | None, context: grpc.aio.ServicerContext) -> bytes:
            start, code, size, admitted = time.perf_counter(), "OK", 0, False
            held: Reservation | None = None
            data = request = None
            failure: tuple[grpc.StatusCode, str, Any] | None = None
            try:
                if limited:
                    self.admit()
                    admitted = True
                caller = self.caller(method, self.metadata(context))
                timed = phases.started() if read is None else None  # ModelInfer: an inference
                if isinstance(message, bytes):
                    data = message
                elif message is not None:  # READ_UNDER_BUDGET: read now, once the data plane admits it
                    data, held = await self.receive(message, context)
                    phases.lap("read")
                assert data is not None
                request = data
                if read is not None:
                    request = await offload(work(len(data)), None, read, data)  # (a large message: a worker thread)
                    phases.lap("parse")
                # a message read here comes with the reservation that holds it (ModelInfer grows it to its run)
                response = await handle(request, caller, len(data), *(() if held is None else (held,)))
                answer = response if isinstance(response, bytes) else response.SerializeToString()
                size = len(answer)
                if timed is not None and timing:
                    context.set_trailing_metadata(((phases.TRAILER, timed.value()),))
                return answer
            except BaseException as exc:
                code, failure = self.status_of(method, context, exc)
                if failure is None:
                    if isinstance(exc, Exception) and not isinstance(exc, grpc.aio.AbortError):
                        # the call had ended (cancelled, past its deadline): nothing to answer, nothing to log
                        raise asyncio.CancelledError() from None
                    raise
            finally:
                # The message dropped: an abort's AbortError stays with the call's state, which the call's context
                # (a local here) holds, so this frame lives as long as the call does
                message = data = request = None
                if held is not None:
                    held.release()
                if admitted:
                    self.leave()
                self.record(method, code, time.perf_counter() - start, size, context.peer() or "")
            # aborted outside the error's handling, so the AbortError does not keep the error's traceback (and
            # every frame it passed, with the message) alive as its context
            await self._end(context, failure)

        return handler

    @property
    def reclaim_seconds(self) -> float:
        """How long a unary call's message asked for may hold the memory lent to it while others wait."""
        wait = self.plane.settings.memory_wait_seconds
        return RECLAIM_SECONDS if wait is None else min(RECLAIM_SECONDS, wait / 2)

    @property
    def stream_reclaim_seconds(self) -> float:
        """How long a stream with every answer written may hold the memory lent to its next request while others
        wait (`STREAM_RECLAIM_SHARE`)."""
        wait = self.plane.settings.memory_wait_seconds
        return max(self.reclaim_seconds, STREAM_RECLAIM_SHARE * (wait or 10 * RECLAIM_SECONDS))

    def admit_message(self, what: str) -> AbstractAsyncContextManager[Admitted]:
        """The data plane's admission step for a message not yet read (its model unknown until then): some model
        ready and taking requests, and the memory the message may bring in (`RECEIVE_COPIES` x
        POSENC_MAX_REQUEST_BYTES), waited for outside POSENC_MEMORY_WAITERS (the call limit bounds the waiters)."""
        return self.plane.admitted(None, None, RECEIVE_COPIES * self.plane.settings.max_request_bytes, what,
                                   line=False, lent=True)

    async def receive(self, messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                      ) -> tuple[bytes, Reservation]:
        """A unary call's one message, read once the data plane admits it (`admit_message`: refused before a byte
        is read while no model is ready or every queue is full), and the reservation that holds its bytes.

        gRPC core holds at most a stream's flow-control window (64 KiB: BDP probing is off) of a message nobody
        reads; once asked, it takes the whole message, unseen until whole (then twice: its buffer and the bytes
        handed over). So the message is asked for once `RECEIVE_COPIES` x POSENC_MAX_REQUEST_BYTES are reserved,
        lent: if it has not come `reclaim_seconds` later, a request waiting for memory takes them and the call ends
        RESOURCE_EXHAUSTED (a call that sends nothing keeps no memory from others). Once in, the reservation keeps
        `PARSE_COPIES` x its size, what an HTTP body of that size holds (the data plane grows it on to the run). A
        message that has not arrived in time (`RECEIVE_BYTES_PER_SECOND`) is DEADLINE_EXCEEDED; one that has not
        arrived `drain_receive_seconds` after the server began to drain, UNAVAILABLE."""
        settings = self.plane.settings
        seconds = settings.body_timeout + settings.max_request_bytes / RECEIVE_BYTES_PER_SECOND
        async with self.admit_message("a gRPC message being received") as admitted:
            held = admitted.reservation
            phases.lap("admit")
            reclaimed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            held.lend(partial(_settle, reclaimed), self.reclaim_seconds)
            reading = asyncio.ensure_future(_message_reader(messages, context)())
            drain_cut = asyncio.ensure_future(self._drain_cut())
            try:
                async with asyncio.timeout(seconds):
                    await asyncio.wait((reading, reclaimed, drain_cut), return_when=asyncio.FIRST_COMPLETED)
                if reclaimed.done():  # (even if the message came at that moment: its memory is no longer held)
                    raise Unavailable(self.reclaimed_message(
                        f"the request message had not arrived {self.reclaim_seconds:g} s after the server asked for it"
                    ), retry_after=1, overloaded=True)
                if not reading.done():
                    raise Unavailable(UNSENT_AT_DRAIN.format(seconds=self.drain_receive_seconds))
                data = reading.result()
            except TimeoutError:
                raise RequestTimeout(f"the request message did not arrive within {seconds:g} s of its read "
                                     "(POSENC_BODY_TIMEOUT plus a second per MiB of POSENC_MAX_REQUEST_BYTES)"
                                     ) from None
            finally:
                held.keep()
                await _stop(reading)
                await _stop(drain_cut)
            if data is None:
                raise BadRequest("the call carried no request message")
            if len(data) >= RELEASE_AFTER_BYTES and self.trims_alone() and holds_more_free_than(self.kept_bytes):
                # gRPC core's buffer, freed into the heap in pieces, stays resident beside the bytes: handed back
                # before the reservation shrinks once the heaps hold more than they may keep (the next messages'
                # pieces reuse that much)
                await asyncio.to_thread(release_free_memory)
            held.shrink(PARSE_COPIES * len(data))  # what its parse holds, as an HTTP body's reservation
        return data, held

    def trims_alone(self) -> bool:
        """Whether a large message just received may trim the heaps: only while it is the one gRPC call in progress.
        With others in progress, the memory freed is what their own copies take next (8 clients of 25 MB messages:
        a trim per message had every copy fault its pages in again, an eighth of the server's core clearing pages,
        9.0-9.4 against 9.8-12.0 requests a second); the budget bounds what they hold, and the heaps are trimmed by
        the next message received alone, or when the models go idle (`posenc.service.inference.runtime.arena`)."""
        return self.active <= 1

    def reclaimed_message(self, what: str) -> str:
        """Why a call whose lent memory was taken back ended (`what`: what it did not send, and how long)."""
        held = RECEIVE_COPIES * self.plane.settings.max_request_bytes
        return (f"{what}, while other requests waited for memory: the {held} bytes held for it ({RECEIVE_COPIES} x "
                "POSENC_MAX_REQUEST_BYTES) went to them; retry later")

    @staticmethod
    async def _end(context: grpc.aio.ServicerContext, failure: tuple[grpc.StatusCode, str, Any]) -> NoReturn:
        """End the call with `failure` (AbortError, as every abort); a call that ended meanwhile (its status cannot
        be sent: the client cancelled) ends as cancelled, quietly, where gRPC would log the failed send."""
        try:
            await context.abort(*failure)
        except grpc.aio.AbortError:
            raise
        except Exception:
            raise asyncio.CancelledError() from None
        raise AssertionError("unreachable: abort raises")

    def status_of(self, method: str, context: grpc.aio.ServicerContext,
                  exc: BaseException) -> tuple[str, tuple[grpc.StatusCode, str, Any] | None]:
        """The code a failed call ends with, and the (status, message, trailing metadata) to abort it with
        (None: it ended already: cancelled, past its deadline, aborted)."""
        if isinstance(exc, asyncio.CancelledError) or context.cancelled():  # (a write to a cancelled call fails)
            remaining = context.time_remaining()
            return ("DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"), None
        if isinstance(exc, grpc.aio.AbortError) or not isinstance(exc, Exception):
            code = context.code()
            return (code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"), None
        if isinstance(exc, ServiceError):
            failure = grpc_failure(exc)
            return failure[0].name, failure
        log.error("unhandled error in gRPC %s", method, exc_info=exc)
        return "INTERNAL", (grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE, ())

    # -- streams

    def stream(self, method: str) -> Callable[..., Awaitable[None]]:
        """The handler of ModelStreamInfer: request bytes in, `ModelStreamInferResponse`s out, in request order.

        An error answers its own request (`error_message`: the HTTP error's text; a message that is not a
        `ModelInferRequest` too) and the stream goes on. At most `STREAM_WINDOW` requests of a stream are in
        progress: later ones stay unread until a response is written, so a client that stops reading its
        responses stops the server reading its requests. With every request answered, a stream that sends no
        request for POSENC_GRPC_STREAM_IDLE_SECONDS ends DEADLINE_EXCEEDED (an idle stream holds a place); only the
        time the server waits for its client counts. Once the server drains, `DRAIN_QUIET_SECONDS` of that end it
        UNAVAILABLE.

        Each request is asked of gRPC core once the data plane admits it (`admit_message`; a full queue or memory
        not free in time: the stream waits, unread; no model ready: the stream ends UNAVAILABLE after answering what
        it read), its memory reserved and lent as a unary call's
        (`receive`): once every answer is written, a request that has not come `stream_reclaim_seconds` later gives
        that memory to whoever waits for it, and the stream ends RESOURCE_EXHAUSTED. Each answer stays counted
        until it is written."""
        idle = self.plane.settings.grpc_stream_idle_seconds

        async def handler(request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            start, code, count, admitted = time.perf_counter(), "OK", 0, False
            window = asyncio.Semaphore(STREAM_WINDOW)  # requests read and not yet answered
            # answers in request order, each with the reservation that holds it until written; None: the end
            pending: asyncio.Queue[asyncio.Future[tuple[bytes, Reservation]] | None] = asyncio.Queue()
            reader: asyncio.Future[None] | None = None
            task: asyncio.Future[tuple[bytes, Reservation]] | None = None
            stream = asyncio.current_task()
            in_progress = 0  # requests read whose answer is not yet written
            asked: Reservation | None = None  # the lent reservation of the request asked for, until it comes
            asked_at = 0.0  # when it was asked for: the stream is idle only while the server waits for its client
            answered_at = 0.0  # when the last answer was written
            reclaimed = False

            def on_reclaim() -> None:
                # the budget took the memory of the request asked for: the stream ends now. Only while it is idle
                # (every answer written: nothing is cut half-sent, the status reaches the client)
                nonlocal reclaimed
                reclaimed = True
                if stream is not None:
                    stream.cancel()

            try:
                caller = self.caller(method, self.metadata(context))
                await self.admit_stream()
                admitted = True

                async def read() -> None:
                    nonlocal asked, asked_at, in_progress
                    next_message = _message_reader(request_iterator, context)
                    try:
                        while True:
                            await window.acquire()
                            held = await self._admit_stream_request()
                            held.lend(on_reclaim, None if in_progress else self.stream_reclaim_seconds)
                            asked, asked_at = held, time.monotonic()
                            try:
                                data = await next_message()
                            except BaseException:
                                held.release()  # (the stream ended under the read: idle, cancelled, reclaimed)
                                raise
                            finally:
                                asked = None
                                held.keep()
                            if reclaimed:  # the stream ends (`on_reclaim`), this request with it
                                return
                            if data is None:
                                held.release()
                                break
                            held.shrink(PARSE_COPIES * len(data))
                            in_progress += 1
                            one = asyncio.ensure_future(self._stream_one(data, caller, held))
                            pending.put_nowait(one)
                            # the request is its task's: this frame waits for the next one without it (kept here, it
                            # outlived its reservation as long as the stream waited)
                            del data, held, one
                    finally:
                        pending.put_nowait(None)  # the end, or a failed read (raised by `await reader`)

                reader = asyncio.ensure_future(read())
                while True:
                    # nothing in progress while the queue is empty: every request read is answered. Idle: its client
                    # sends nothing it was asked for since its last answer (time spent waiting for the stream's
                    # admission does not count)
                    got = bool(pending.qsize())
                    if got:
                        task = pending.get_nowait()
                    while not got:
                        waited = 0.0 if asked is None else time.monotonic() - max(asked_at, answered_at)
                        if self.draining and asked is not None and waited >= DRAIN_QUIET_SECONDS:
                            # every answer written, its client quiet: the stream ends now, not at the drain's cut
                            await self._end_stream(context, grpc.StatusCode.UNAVAILABLE, DRAINING)
                            code = "CANCELLED"
                            return
                        if waited >= idle:
                            await self._end_idle(context, idle)  # raises AbortError, unless the call had ended
                            code = "CANCELLED"
                            return
                        with contextlib.suppress(TimeoutError):
                            task = await asyncio.wait_for(pending.get(), min(idle - waited, DRAIN_CHECK_SECONDS))
                            got = True
                    if task is None:
                        break
                    written, holding = await task
                    try:
                        await context.write(written)
                    except Exception:  # the call ended under the write (cancelled, or the server stopping)
                        code = "CANCELLED"
                        return
                    finally:
                        holding.release()
                    window.release()
                    count += len(written)
                    in_progress -= 1
                    answered_at = time.monotonic()
                    if not in_progress and asked is not None:  # idle from now: its time starts
                        asked.lend(on_reclaim, self.stream_reclaim_seconds)
                await reader
            except BaseException as exc:
                if reclaimed and isinstance(exc, asyncio.CancelledError) and stream is not None:
                    stream.uncancel()  # its own doing: the stream ends with why
                    exc = Unavailable(self.reclaimed_message(
                        f"the stream sent no request for {self.stream_reclaim_seconds:g} s with none in progress"),
                        retry_after=1, overloaded=True)
                code, answer = self.status_of(method, context, exc)
                if answer is not None:
                    await self._end(context, answer)
                raise
            finally:
                answers = [task, *(pending.get_nowait() for _ in range(pending.qsize()))]
                for future in [reader, *answers]:
                    if future is not None and not future.done():
                        future.cancel()
                    elif future is not None and not future.cancelled():
                        future.exception()  # retrieved: a read the call's end (an abort, a cancel) broke is no error
                for unwritten in answers:  # answered, never written: their memory back
                    if unwritten is not None and unwritten.done() and not unwritten.cancelled() \
                            and unwritten.exception() is None:
                        unwritten.result()[1].release()
                if admitted:
                    self.leave_stream()
                self.record(method, code, time.perf_counter() - start, count, context.peer() or "")

        return handler

    async def _admit_stream_request(self) -> Reservation:
        """The admission of a stream's next request (`admit_message`): while the queues are full or the memory
        does not come free in time, the stream waits, its request unread; a server with no model ready ends it."""
        while True:
            try:
                async with self.admit_message("a gRPC stream's next request") as admitted:
                    return admitted.reservation
            except Unavailable as exc:
                if not exc.overloaded:
                    raise
                await asyncio.sleep(float(exc.headers.get("Retry-After", 1)))

    @classmethod
    async def _end_idle(cls, context: grpc.aio.ServicerContext, idle: float) -> None:
        """End a stream that stayed idle: DEADLINE_EXCEEDED naming the setting."""
        await cls._end_stream(context, grpc.StatusCode.DEADLINE_EXCEEDED, (
            f"the stream sent no request for {idle:g} s with none in progress "
            "(POSENC_GRPC_STREAM_IDLE_SECONDS): it is ended to give its place to other calls; "
            "open a new stream to send more"))

    @staticmethod
    async def _end_stream(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str) -> None:
        """End a stream with nothing in progress: `code` and `details` (AbortError, as every abort). Returns when the
        call had ended meanwhile (cancelled, or cut by the server's stop): there is nothing to tell."""
        try:
            await context.abort(code, details)
        except grpc.aio.AbortError:
            raise
        except Exception:  # the status could not be sent: the call is over
            return

    async def _stream_one(self, data: bytes, caller: SharedMemoryCaller,
                          held: Reservation) -> tuple[bytes, Reservation]:
        """One request of a stream (`held`: the reservation of its bytes, grown to its run), answered as a
        `ModelStreamInferResponse`, with `held` holding the answer until it is written (`WRITE_COPIES`: the caller
        releases it then); an answer nobody wrote held memory outside the budget while it waited for its client."""
        names: Names = ("", "", "")
        try:
            call = await self.infer_call(data, caller, held)
            del data
            names = call.names
            answered = await self.plane.infer(call)  # (its reservation is `held`, grown in place)
            framed = stream_response(answered.value)
            del answered
            held.shrink(WRITE_COPIES * len(framed))
            return framed, held
        except ServiceError as exc:
            message = grpc_details(exc.message)  # as a unary call's status message
        except Exception as exc:  # this request's own failure; the stream goes on
            log.error("unhandled error in a gRPC stream request", exc_info=exc)
            message = INTERNAL_MESSAGE
        except BaseException:
            held.release()
            raise
        held.release()
        return pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(
            model_name=names[0], model_version=names[1], id=names[2])).SerializeToString(), held

    # -- health and metadata: the data plane's answers as messages

    async def ServerLive(self, request: pb.ServerLiveRequest, caller: SharedMemoryCaller, size: int) -> Message:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, caller: SharedMemoryCaller, size: int) -> Message:
        return pb.ServerReadyResponse(ready=not self.plane.problems)

    async def ModelReady(self, request: pb.ModelReadyRequest, caller: SharedMemoryCaller, size: int) -> Message:
        return pb.ModelReadyResponse(ready=self.plane.model(request.name, request.version).ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, caller: SharedMemoryCaller, size: int) -> Message:
        return pb.ServerMetadataResponse(**self.plane.server_metadata())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, caller: SharedMemoryCaller, size: int) -> Message:
        return model_metadata_message(self.plane.model_metadata(request.name, request.version))

    async def ModelConfig(self, request: pb.ModelConfigRequest, caller: SharedMemoryCaller, size: int) -> Message:
        return model_config_message(self.plane.model_config(request.name, request.version))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, caller: SharedMemoryCaller,
                              size: int) -> Message:
        return statistics_message(self.plane.statistics(request.name or None, request.version))

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, caller: SharedMemoryCaller,
                              size: int) -> Message:
        return repository_index_message(self.plane.repository_index(request.ready))

    # -- system shared memory

    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest,
                                       caller: SharedMemoryCaller, size: int) -> Message:
        regions = await self.plane.shared_memory_status(caller, request.name, f"/{SERVICE}/SystemSharedMemoryStatus")
        return shared_memory_status_message(regions)

    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest,
                                         caller: SharedMemoryCaller, size: int) -> Message:
        body = {"key": request.key, "offset": request.offset, "byte_size": request.byte_size}
        await self.plane.register(caller, request.name, body, f"/{SERVICE}/SystemSharedMemoryRegister")
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                           caller: SharedMemoryCaller, size: int) -> Message:
        await self.plane.unregister(caller, request.name, f"/{SERVICE}/SystemSharedMemoryUnregister")
        return pb.SystemSharedMemoryUnregisterResponse()

    # -- inference

    async def ModelInfer(self, data: bytes, caller: SharedMemoryCaller, size: int,
                         held: Reservation | None = None) -> bytes:
        return await self.run(await self.infer_call(data, caller, held))

    async def infer(self, request: pb.ModelInferRequest, raw_inputs: RawInputs, caller: SharedMemoryCaller,
                    size: int, held: Reservation | None = None) -> bytes:
        """One infer request of `size` bytes, already split (`raw_inputs`: its `raw_input_contents`; `held`: the
        reservation that holds it since it arrived, grown by the plane), run by the data plane: the serialized
        response."""
        return await self.run(GrpcInferCall(caller, size, held, split=(request, raw_inputs)))

    @staticmethod
    async def infer_call(data: bytes, caller: SharedMemoryCaller, held: Reservation | None) -> GrpcInferCall:
        """The data plane's call for a message: when its model's name leads it (`leading_names`), the plane admits it
        to that model before it is parsed; otherwise it is parsed first (in a worker thread when large)."""
        names = leading_names(data)
        if names is not None:
            return GrpcInferCall(caller, len(data), held, data=data, names=names)
        split = await offload(work(len(data)), None, decode_infer, data)
        phases.lap("parse")
        return GrpcInferCall(caller, len(data), held, split=split)

    async def run(self, call: GrpcInferCall) -> bytes:
        """`call` run by the data plane: the serialized response (its bytes are gRPC's from here)."""
        answered = await self.plane.infer(call)
        answered.release()
        return answered.value


def _message_reader(messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext
                    ) -> Callable[[], Awaitable[bytes | None]]:
    """How a handler reads its next message (None: the client sent no more): `context.read()`, which keeps nothing
    once it has returned; gRPC's request iterator is a generator whose frame holds the message it yielded until
    the next one comes (a stream waiting for its next request kept its last one, outside the budget). The iterator
    where the context has no `read` (a stand-in context)."""
    read = getattr(context, "read", None)
    if read is None:
        return partial(anext, aiter(messages), None)

    async def next_message() -> bytes | None:
        try:
            message = await read()
        except grpc.aio.AbortError:
            raise
        except grpc.aio.BaseError as exc:  # gRPC's own: the server stopped under the read (the drain has ended)
            raise Unavailable(f"the server stopped while the request message was being received ({exc}); "
                              "retry later", retry_after=1) from None
        return None if message is grpc.aio.EOF else message

    return next_message


async def _stop(reading: asyncio.Future[Any]) -> None:
    """Cancel a read that has not finished and wait for it to end; its failure, if any, retrieved (the call's end
    broke it)."""
    if not reading.done():
        reading.cancel()
        await asyncio.wait((reading,))
    if not reading.cancelled():
        reading.exception()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class GrpcInferCall:
    """A `ModelInferRequest` as the data plane runs it: already in memory (gRPC read it, within its size limit), split
    into its fields and `raw_input_contents` when the plane reads it, once it is admitted to the model its leading
    fields name (`data`, `names`), or before (`split`); answered as a serialized `ModelInferResponse`."""

    protocol = "grpc"

    def __init__(self, caller: SharedMemoryCaller, size: int, held: Reservation | None = None, *,
                 data: bytes | None = None, names: Names | None = None, split: InferMessage | None = None) -> None:
        self.caller, self.size, self.held = caller, size, held
        self.data, self.split = data, split
        if split is not None:
            names = (split[0].model_name, split[0].model_version, split[0].id)
        assert names is not None, "a call needs its message split or its leading names"
        self.names = names
        self.model_name, self.model_version = names[0], names[1] or None
        # the message's copies, and its typed contents decoded (counted by the split, not yet built; for a message
        # split only when read, grown to then): the reservation that holds the message since it arrived grown to it
        self.reserve_bytes = PARSE_COPIES * size + (0 if split is None else decoded_bytes(split[1]))
        self.raw_inputs: RawInputs | list[memoryview] = [] if split is None else split[1]

    async def read(self) -> pb.ModelInferRequest:
        if self.split is None:
            data, self.data = self.data, None
            assert data is not None
            self.split = await offload(work(self.size), None, decode_infer, data)
            del data
            request = self.split[0]
            named = (request.model_name, request.model_version)
            if named != self.names[:2]:
                # admitted to the model its leading fields name: a later copy of a field (protobuf keeps the last)
                # names another
                raise BadRequest(f"the ModelInferRequest names its model twice ({echo(self.names[0])} version "
                                 f"{echo(self.names[1])}, then {echo(named[0])} version {echo(named[1])}): name it "
                                 "once")
            self.names = (*named, request.id)
            phases.lap("parse")
            decoded = decoded_bytes(self.split[1])
            if decoded and self.held is not None:
                await self.held.grow(self.reserve_bytes + decoded, f"an inference on '{self.model_name}'")
        request, self.raw_inputs = self.split
        return request

    def parse_work(self, request: pb.ModelInferRequest) -> int:
        raw = sum(len(chunk) for chunk in self.raw_inputs)
        return work(self.size - raw, raw)

    def parse(self, request: pb.ModelInferRequest, regions: RegionsFor | None) -> tuple[InferRequest, Buffer]:
        return decode_infer_request(request, regions, self.raw_inputs)

    def encode_work(self, request: InferRequest, outputs: Mapping[str, np.ndarray]) -> int:
        return work(0, sum(array.nbytes for array in outputs.values()))

    def encode(self, model_name: str, request: InferRequest, outputs: Mapping[str, np.ndarray],
               order: Sequence[str]) -> bytes:
        return encode_infer_response(model_name, VERSION, request, dict(outputs), order)

    def watching(self) -> AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()  # a cancelled call cancels the task awaiting the worker thread
