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

from posenc.service.budget import RELEASE_AFTER_BYTES, Reservation, release_free_memory
from posenc.service.errors import (
    INTERNAL_MESSAGE,
    BadRequest,
    Forbidden,
    RequestTimeout,
    ServiceError,
    Unavailable,
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
from posenc.service.inference.dataplane import Buffer, DataPlane, offload, work
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
# A unary message being received: gRPC core's buffer and the bytes it hands over, both whole at that moment. Its size
# is unknown until it has arrived, so its read holds this many times POSENC_MAX_REQUEST_BYTES.
RECEIVE_COPIES = 2
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


def decode_infer(data: bytes) -> InferMessage:
    """A `ModelInferRequest` from its bytes, its `raw_input_contents` as views of them (`split_infer_request`);
    400 (INVALID_ARGUMENT) when they are not one, as `decode`."""
    return _parsed(pb.ModelInferRequest, data, split_infer_request)


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
        an `InferMessage` (`decode_infer`), every other one the message."""
        read: Callable[[bytes], Any] = decode_infer if method == "ModelInfer" else partial(decode, request_type)
        timing = method == "ModelInfer" and self.plane.settings.server_timing
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
                timed = phases.started(timing)
                if isinstance(message, bytes):
                    data = message
                elif message is not None:  # READ_UNDER_BUDGET: read now, once the budget holds room for it
                    data, held = await self.receive(message)
                    phases.lap("read")
                assert data is not None
                request = await offload(work(len(data)), None, read, data)  # (a large message: a worker thread)
                phases.lap("parse")
                # a message read here comes with the reservation that holds it (ModelInfer grows it to its run)
                response = await handle(request, caller, len(data), *(() if held is None else (held,)))
                answer = response if isinstance(response, bytes) else response.SerializeToString()
                size = len(answer)
                if timed is not None:
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

    async def receive(self, messages: AsyncIterator[bytes]) -> tuple[bytes, Reservation]:
        """A unary call's one message, read under the memory budget, and the reservation that holds its bytes.

        gRPC core holds at most a stream's flow-control window (64 KiB: BDP probing is off) of a message nobody
        reads; once read, the message is whole in its buffer and then in the bytes handed over, and its size is
        unknown until then. So the read waits until `RECEIVE_COPIES` × POSENC_MAX_REQUEST_BYTES fit in the budget
        (RESOURCE_EXHAUSTED when they do not come free in time; the wait is bounded by the calls in progress, not
        by POSENC_MEMORY_WAITERS), then keeps at most `PARSE_COPIES` × its size, what an HTTP body of that size
        holds before it is read (the data plane grows it to that and on to the run). A message that has not
        arrived in time (`RECEIVE_BYTES_PER_SECOND`) is DEADLINE_EXCEEDED."""
        settings = self.plane.settings
        seconds = settings.body_timeout + settings.max_request_bytes / RECEIVE_BYTES_PER_SECOND
        held = await self.plane.budget.acquire(RECEIVE_COPIES * settings.max_request_bytes,
                                               "a gRPC message being received", line=False)
        try:
            receiver = aiter(messages)
            try:
                async with asyncio.timeout(seconds):
                    data = await anext(receiver, None)
            finally:
                # gRPC's receiver (an async generator) holds the message it yielded until it is closed, in a
                # reference cycle with the call's state that only a full garbage collection frees: 60 MiB kept per
                # large call until then
                close = getattr(receiver, "aclose", None)
                if close is not None:
                    await close()
            if data is None:
                raise BadRequest("the call carried no request message")
            if len(data) >= RELEASE_AFTER_BYTES:
                # gRPC core's buffer, freed into the heap in pieces, would stay resident beside the bytes (heap
                # memory the next large message does not reuse): handed back before the reservation shrinks
                await asyncio.to_thread(release_free_memory)
        except TimeoutError:
            held.release()
            raise RequestTimeout(f"the request message did not arrive within {seconds:g} s of its read "
                                 "(POSENC_BODY_TIMEOUT plus a second per MiB of POSENC_MAX_REQUEST_BYTES)") from None
        except BaseException:
            held.release()
            raise
        held.shrink(PARSE_COPIES * len(data))  # what its parse holds, as an HTTP body's reservation
        return data, held

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
        request for POSENC_GRPC_STREAM_IDLE_SECONDS ends DEADLINE_EXCEEDED (an idle stream holds a place)."""
        idle = self.plane.settings.grpc_stream_idle_seconds

        async def handler(request_iterator: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
            start, code, count, admitted = time.perf_counter(), "OK", 0, False
            window = asyncio.Semaphore(STREAM_WINDOW)  # requests read and not yet answered
            pending: asyncio.Queue[asyncio.Future[bytes] | None] = asyncio.Queue()  # in request order; None: end
            reader: asyncio.Future[None] | None = None
            task: asyncio.Future[bytes] | None = None
            try:
                caller = self.caller(method, self.metadata(context))
                await self.admit_stream()
                admitted = True

                async def read() -> None:
                    try:
                        async for data in request_iterator:
                            await window.acquire()
                            # the message counted in the budget before the next one is read: a stream holds at
                            # most one message outside it
                            held: Reservation | ServiceError
                            try:
                                held = await self.plane.budget.acquire(len(data), "a gRPC stream's request")
                            except ServiceError as exc:  # answered in its turn; the stream goes on
                                held = exc
                            pending.put_nowait(asyncio.ensure_future(self._stream_one(data, caller, held)))
                    finally:
                        pending.put_nowait(None)  # the end, or a failed read (raised by `await reader`)

                reader = asyncio.ensure_future(read())
                while True:
                    try:  # nothing in progress while the queue is empty: every request read is answered
                        task = pending.get_nowait() if pending.qsize() else await asyncio.wait_for(pending.get(), idle)
                    except TimeoutError:
                        await self._end_idle(context, idle)  # raises AbortError, unless the call had ended
                        code = "CANCELLED"
                        return
                    if task is None:
                        break
                    written = await task
                    try:
                        await context.write(written)
                    except Exception:  # the call ended under the write (cancelled, or the server stopping)
                        code = "CANCELLED"
                        return
                    window.release()
                    count += len(written)
                await reader
            except BaseException as exc:
                code, answer = self.status_of(method, context, exc)
                if answer is not None:
                    await self._end(context, answer)
                raise
            finally:
                left = [reader, task, *(pending.get_nowait() for _ in range(pending.qsize()))]
                for future in left:
                    if future is not None and not future.done():
                        future.cancel()
                    elif future is not None and not future.cancelled():
                        future.exception()  # retrieved: a read the call's end (an abort, a cancel) broke is no error
                if admitted:
                    self.leave_stream()
                self.record(method, code, time.perf_counter() - start, count, context.peer() or "")

        return handler

    @staticmethod
    async def _end_idle(context: grpc.aio.ServicerContext, idle: float) -> None:
        """End a stream that stayed idle: DEADLINE_EXCEEDED naming the setting (AbortError, as every abort). Returns
        when the call had ended meanwhile (cancelled, or cut by the server's stop): there is nothing to tell."""
        try:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, (
                f"the stream sent no request for {idle:g} s with none in progress "
                "(POSENC_GRPC_STREAM_IDLE_SECONDS): it is ended to give its place to other calls; "
                "open a new stream to send more"))
        except grpc.aio.AbortError:
            raise
        except Exception:  # the status could not be sent: the call is over
            return

    async def _stream_one(self, data: bytes, caller: SharedMemoryCaller, held: Reservation | ServiceError) -> bytes:
        """One request of a stream (`held`: the reservation of its bytes, released here; or why the budget had no
        room for it), answered as a `ModelStreamInferResponse`."""
        request = pb.ModelInferRequest()
        try:
            if isinstance(held, ServiceError):
                raise held
            request, raw = await offload(work(len(data)), None, decode_infer, data)
            return stream_response(await self.infer(request, raw, caller, len(data), held))
        except ServiceError as exc:
            message = grpc_details(exc.message)  # as a unary call's status message
        except Exception as exc:  # this request's own failure; the stream goes on
            log.error("unhandled error in a gRPC stream request", exc_info=exc)
            message = INTERNAL_MESSAGE
        finally:
            if isinstance(held, Reservation):
                held.release()
        return pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id)).SerializeToString()

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

    async def ModelInfer(self, request: InferMessage, caller: SharedMemoryCaller, size: int,
                         held: Reservation | None = None) -> bytes:
        return await self.infer(*request, caller, size, held)

    async def infer(self, request: pb.ModelInferRequest, raw_inputs: RawInputs, caller: SharedMemoryCaller,
                    size: int, held: Reservation | None = None) -> bytes:
        """One infer request of `size` bytes (`raw_inputs`: its `raw_input_contents`; `held`: the reservation that
        holds it since it arrived, grown by the plane), run by the data plane: the serialized response."""
        answered = await self.plane.infer(GrpcInferCall(request, raw_inputs, caller, size, held))
        answered.release()  # the response's bytes are gRPC's from here
        return answered.value


class GrpcInferCall:
    """A `ModelInferRequest` as the data plane runs it: already in memory (gRPC read it, within its size limit),
    decoded from its fields and `raw_input_contents`, answered as a serialized `ModelInferResponse`."""

    def __init__(self, request: pb.ModelInferRequest, raw_inputs: RawInputs, caller: SharedMemoryCaller,
                 size: int, held: Reservation | None = None) -> None:
        self.request, self.raw_inputs, self.caller, self.size = request, raw_inputs, caller, size
        self.model_name, self.model_version = request.model_name, request.model_version or None
        # the message's copies, and its typed contents decoded (counted by the walk, not yet built): the
        # reservation that holds the message since it arrived (`Servicer.receive`, a stream's reader) grown to it
        self.reserve_bytes = PARSE_COPIES * size + decoded_bytes(raw_inputs)
        self.held = held

    async def read(self) -> pb.ModelInferRequest:
        return self.request

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
