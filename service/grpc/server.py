"""The gRPC server `posenc serve` runs beside HTTP (POSENC_GRPC_PORT; 0 = none), in the same event loop and on
the same data plane (`posenc.service.serving.process` starts and stops it; the serving process's `Server` begins its
drain): `inference.GRPCInferenceService` (`posenc.service.grpc.servicer`), `grpc.health.v1.Health` and server
reflection.

Limits: a message larger than POSENC_MAX_REQUEST_BYTES is refused with RESOURCE_EXHAUSTED by gRPC itself from
its length prefix, before it is read. POSENC_GRPC_MAX_CONCURRENT_RPCS calls at once: one more unary call is
RESOURCE_EXHAUSTED with a retry hint, one more stream waits (unread) until a call ends or its deadline passes;
streams hold at most three quarters of the places, health and metadata calls none, and an idle stream ends after
POSENC_GRPC_STREAM_IDLE_SECONDS (`posenc.service.grpc.servicer`). Compressed messages are refused
(`RECEIVE_OPTIONS`).
Health: the server ("") and `inference.GRPCInferenceService` are SERVING when every model loaded, and each
model's name is SERVING when that model is ready, so a Kubernetes gRPC probe can name either. A model's name
follows the `health` group of POSENC_RESTRICTED_API (PERMISSION_DENIED without its metadata, as ModelReady);
the server's names stay open, since the kubelet's probe sends no metadata (`RestrictedHealth`). With several
workers each binds the port with SO_REUSEPORT, as uvicorn's workers share the HTTP socket; with one, a port in
use is a start-up failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from tritonclient.grpc import service_pb2 as pb

from posenc.service.grpc.servicer import READ_UNDER_BUDGET, SERVICE, Recorder, Servicer
from posenc.service.inference.runtime.repository import RepositoryEntry
from posenc.service.metrics import Metrics, access_logging, log_access
from posenc.service.process import ServiceProcess

log = logging.getLogger("posenc.grpc")

# this process's started gRPC servers and their health services (`drain`)
_SERVING: dict[grpc.aio.Server, RestrictedHealth] = {}
_STOPPING: set[asyncio.Task[None]] = set()  # the stops `drain` began

GRPC_ACCESS_MESSAGE = "%s %s %s %.1fms %dB"  # GRPC, method path, code, duration, response bytes (a stream: responses)
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# What gRPC core may hold that posenc has not read. Without BDP probing, a stream's flow-control window stays at
# HTTP/2's initial 64 KiB until its message is read (with it, every stream's window grows to megabytes whether its
# message is read or not: 1,000 streams whose requests waited unread held 4 GB). Only uncompressed messages are
# accepted: a compressed one is UNIMPLEMENTED before it is inflated (60 kB of gzip on the wire inflate to a 60 MiB
# message that no budget counted).
RECEIVE_OPTIONS = (("grpc.http2.bdp_probe", 0), ("grpc.compression_enabled_algorithms_bitset", 1))
STREAM_METHODS = ("ModelStreamInfer",)
# No SETTINGS_MAX_CONCURRENT_STREAMS (`grpc.max_concurrent_streams`): a client that opens more streams at once than it
# allows, before the server's settings arrive, gets them refused (REFUSED_STREAM: UNAVAILABLE, and INTERNAL), where
# a stream past the call limit waits, unread, 64 KiB of it in gRPC core.


class RestrictedHealth(health.aio.HealthServicer):
    """`grpc.health.v1.Health` under the restricted groups (`Servicer.guard_health`): a model's status needs the
    `health` group's key when that group is restricted; the server's does not."""

    def __init__(self, servicer: Servicer) -> None:
        super().__init__()
        self.servicer = servicer

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> health_pb2.HealthCheckResponse:
        await self.servicer.guard_health(f"/{HEALTH_SERVICE}/Check", request.service, context)
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext) -> None:
        await self.servicer.guard_health(f"/{HEALTH_SERVICE}/Watch", request.service, context)
        await super().Watch(request, context)


def inference_handler(servicer: Servicer) -> grpc.GenericRpcHandler:
    """The methods posenc serves, each reading its request's bytes itself (a malformed message is then an
    INVALID_ARGUMENT naming the message, where gRPC's own decoding would answer INTERNAL) and answering bytes
    (an infer response is assembled around its outputs' buffers). Methods it does not serve are absent: gRPC
    answers UNIMPLEMENTED."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        # requests and responses are bytes both ways: the handlers decode and encode them themselves
        if method.name in STREAM_METHODS:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(servicer.stream(method.name))
        elif hasattr(servicer, method.name):
            handle = servicer.unary(method.name, getattr(pb, method.input_type.name), getattr(servicer, method.name))
            # a method that reads its message itself is registered as client-streaming (the wire is the same): gRPC
            # core then receives the message only when the handler asks, once the data plane admits it
            # (`Servicer.receive`)
            register = (grpc.stream_unary_rpc_method_handler if method.name in READ_UNDER_BUDGET
                        else grpc.unary_unary_rpc_method_handler)
            handlers[method.name] = register(handle)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def health_statuses(problems: Sequence[str], models: Mapping[str, RepositoryEntry]) -> dict[str, int]:
    """Service name -> health status: the server and the inference service, and every model by name."""
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    overall = not_serving if problems else serving
    statuses = {"": overall, SERVICE: overall}
    statuses.update({name: serving if entry.ready else not_serving for name, entry in models.items()})
    return statuses


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def grpc_recorder(metrics: Metrics, access_log_enabled: bool) -> Recorder:
    """What is recorded of every gRPC call (a stream: when it ends; `nbytes`: the responses it wrote): its metrics
    by method and code, and, if enabled, one access-log record
    `GRPC /inference.GRPCInferenceService/<method> <code> <ms> <bytes>`."""

    def record(method: str, code: str, seconds: float, nbytes: int, peer: str) -> None:
        metrics.observe_grpc(method, code, seconds)
        if not access_logging(access_log_enabled):
            return
        path = f"/{SERVICE}/{method}"
        duration_ms = round(seconds * 1000.0, 3)
        fields = {"method": "GRPC", "path": path, "route": path, "grpc_code": code, "duration_ms": duration_ms,
                  "bytes": nbytes, "client": peer}
        log_access(GRPC_ACCESS_MESSAGE, ("GRPC", path, code, duration_ms, nbytes), fields, "record_grpc")

    return record


async def start_grpc_server(process: ServiceProcess, record: Recorder, *, workers: int) -> grpc.aio.Server:
    """Build, bind and start the server on the (started) `process` (`record`: every call's method, code, time, size
    and peer); RuntimeError naming the address when the port cannot be bound. Its health follows the plane's
    readiness."""
    settings = process.settings
    # The call limit is the servicer's own: grpc.aio's `maximum_concurrent_rpcs` can undercount, and a stream
    # refused while its client is still writing ends as INTERNAL on the client (grpc/grpc#36066).
    server = grpc.aio.server(
        options=[*RECEIVE_OPTIONS,
                 ("grpc.max_receive_message_length", settings.max_request_bytes),
                 ("grpc.max_send_message_length", -1),
                 ("grpc.so_reuseport", 1 if workers > 1 else 0)])
    plane = process.dataplane
    if plane is None:
        raise RuntimeError("gRPC needs a started process: its data plane is made by ServiceProcess.start")
    servicer = Servicer(plane, record)
    server.add_generic_rpc_handlers((inference_handler(servicer),))
    checker = RestrictedHealth(servicer)
    for name, status in health_statuses(list(plane.problems), plane.engine.models).items():
        await checker.set(name, status)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    reflection.enable_server_reflection((SERVICE, HEALTH_SERVICE, reflection.SERVICE_NAME), server)
    address = listen_address(settings.host, settings.grpc_port)
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"gRPC cannot listen on {address} (POSENC_GRPC_PORT; 0 turns gRPC off): {exc}") from None
    if not bound:
        raise RuntimeError(f"gRPC cannot listen on {address} (POSENC_GRPC_PORT; 0 turns gRPC off)")
    await server.start()
    _SERVING[server] = checker

    async def changed() -> None:
        await update_health(server, plane.problems, plane.engine.models)

    plane.watch(changed)
    log.info("gRPC (KServe v2 / Triton, health, reflection) on %s", address)
    return server


def drain(grace: float) -> None:
    """Begin the graceful stop of this process's gRPC servers (no new calls; those in flight get `grace` seconds),
    at the moment the HTTP server begins its own drain after SIGTERM, so both drain together."""
    for server, checker in list(_SERVING.items()):
        checker.servicer.drain(grace)  # quiet streams and messages not yet sent end before the cut
        task = asyncio.ensure_future(_stop(server, checker, grace))
        _STOPPING.add(task)
        task.add_done_callback(_STOPPING.discard)


async def _stop(server: grpc.aio.Server, checker: RestrictedHealth, grace: float) -> None:
    await checker.enter_graceful_shutdown()  # every service NOT_SERVING: probes see the drain
    await server.stop(grace)


async def stop(server: grpc.aio.Server, grace: float) -> None:
    """Stop `server` (after `drain`: wait for the stop it began) and forget it."""
    await server.stop(grace)
    _SERVING.pop(server, None)


async def update_health(server: grpc.aio.Server, problems: Sequence[str],
                        models: Mapping[str, RepositoryEntry]) -> None:
    """Set the health statuses of `server` anew (a model loaded or failed): ignored once it drains."""
    checker = _SERVING.get(server)
    if checker is None:
        return
    for name, status in health_statuses(list(problems), models).items():
        await checker.set(name, status)
