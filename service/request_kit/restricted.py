"""Restricted protocol groups (`POSENC_RESTRICTED_API`, Triton's `--http-restricted-api`) and who may use
shared memory.

A restricted group's routes answer 403 unless the request carries the configured header with the configured
value (compared in constant time; the value is never echoed). A request to any protocol group's route that
carries one of the configured headers more than once is refused with 400 naming it (`duplicate_key_message`):
HTTP servers and gRPC libraries disagree on which copy counts (the first, the last), so none is chosen.

Shared memory lets a client make the server read and write memory on the server's host, so it needs more than
reaching the port:

* over the Unix socket (`POSENC_UDS`), the peer's credentials decide, object by object
  (`posenc.service.inference.shared_memory.guard`), whether or not the shared-memory group is restricted (a peer
  that sends the key as well is trusted like a TCP client with it);
* over TCP, only a request that carries the `shared-memory` group's header may use it, and without that group
  in POSENC_RESTRICTED_API nobody may: the server cannot tell who is at the other end.

Regions belong to whoever registered them (`SharedMemoryCaller.owner`): the peer's uid on the Unix socket,
the holders of the shared-memory key over TCP. Each owner has its own names; none sees or touches another's.

The middleware puts a `SharedMemoryCaller` in every request's scope; the shared-memory routes and the infer
route read it with `shared_memory_caller`.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from posenc.service.errors import BadRequest, Forbidden, error_response
from posenc.service.request_kit.descriptors import DESCRIPTORS_SCOPE_KEY, PassedDescriptors
from posenc.service.request_kit.unix import PEER_SCOPE_KEY, Peer

CALLER_SCOPE_KEY = "posenc.shared_memory_caller"
SHARED_MEMORY_GROUP = "shared-memory"

_MODEL = r"/v2/models/[^/]+(?:/versions/[^/]+)?"


@dataclass(frozen=True)
class ProtocolGroup:
    """One protocol group (Triton's grouping): its HTTP routes and its gRPC methods
    (`inference.GRPCInferenceService`)."""

    routes: re.Pattern[str]
    methods: frozenset[str] = frozenset()


def _group(routes: str, *methods: str) -> ProtocolGroup:
    return ProtocolGroup(re.compile(routes), frozenset(methods))


# The one table of the protocol groups, both protocols: a path or method in none of them is never restricted.
PROTOCOL_GROUPS: dict[str, ProtocolGroup] = {
    "health": _group(rf"/v2/health/(?:live|ready)|{_MODEL}/ready", "ServerLive", "ServerReady", "ModelReady"),
    "metadata": _group(rf"/v2/?|{_MODEL}", "ServerMetadata", "ModelMetadata"),
    "inference": _group(rf"{_MODEL}/(?:infer|check)", "ModelInfer", "ModelStreamInfer"),
    "shared-memory": _group(r"/v2/(?:system|cuda)sharedmemory(?:/.*)?", "SystemSharedMemoryStatus",
                            "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister"),
    "model-config": _group(rf"{_MODEL}/config", "ModelConfig"),
    "model-repository": _group(r"/v2/repository(?:/.*)?", "RepositoryIndex"),
    "statistics": _group(rf"{_MODEL}/stats", "ModelStatistics"),
    "trace": _group(r"/v2(?:/models/[^/]+)?/trace/setting"),
    "logging": _group(r"/v2/logging"),
}
GROUP_ROUTES: dict[str, re.Pattern[str]] = {name: group.routes for name, group in PROTOCOL_GROUPS.items()}
METHOD_GROUPS: dict[str, str] = {method: name for name, group in PROTOCOL_GROUPS.items() for method in group.methods}


def group_of(path: str) -> str | None:
    """The protocol group of a request path, or None."""
    return next((group for group, routes in GROUP_ROUTES.items() if routes.fullmatch(path)), None)


@dataclass(frozen=True)
class SharedMemoryCaller:
    """Who asks to use shared memory: a Unix-socket peer (judged by its credentials), a TCP client that sent
    the shared-memory key (trusted as the operator configured), or neither (refused)."""

    peer: Peer | None
    has_key: bool
    descriptors: PassedDescriptors | None = None  # what a Unix-socket peer sent with this request (SCM_RIGHTS)

    @property
    def owner(self) -> str:
        """The scope its regions are named in: the peer's uid, or the shared-memory key's holders."""
        return f"uid {self.peer.uid}" if self.peer is not None else "the shared-memory key"

    def require(self, what: str) -> None:
        """403 unless this caller may use shared memory at all (`what`: the action, for the message)."""
        if self.peer is None and not self.has_key:
            raise Forbidden(f"{what}: shared memory over TCP needs the header of the '{SHARED_MEMORY_GROUP}' group "
                            "of POSENC_RESTRICTED_API (and the server has to be configured with one); clients on "
                            "the server's host can use the Unix socket (POSENC_UDS) instead")


def restricted_message(path: str, group: str, header: str) -> str:
    """The 403 of a restricted group's route (HTTP) or method (gRPC, where the header is call metadata)."""
    return (f"{path} is in the restricted protocol group '{group}': send the header '{header}' with the value this "
            "server is configured with (POSENC_RESTRICTED_API)")


def duplicate_key_message(header: str) -> str:
    """The 400 (INVALID_ARGUMENT over gRPC) of a request that carries a restriction's header more than once."""
    return (f"the header '{header}' (a key of POSENC_RESTRICTED_API) is sent more than once; send it once, with "
            "one value")


def repeated_key(headers: Iterable[str], keys: Collection[str]) -> str | None:
    """The first of `keys` (header names in lower case) that `headers` (names, any case) hold more than once."""
    seen: set[str] = set()
    for name in headers:
        lowered = name.lower()
        if lowered in keys:
            if lowered in seen:
                return lowered
            seen.add(lowered)
    return None


def _header(scope: Scope, name: str) -> bytes | None:
    encoded = name.encode("latin-1")
    return next((value for key, value in scope.get("headers", ()) if key.lower() == encoded), None)


def _carries(scope: Scope, restriction: tuple[str, str]) -> bool:
    value = _header(scope, restriction[0])
    return value is not None and hmac.compare_digest(value, restriction[1].encode())


class RestrictedApi:
    """ASGI middleware: 400 for a protocol group's route with a restriction's header twice, 403 for a restricted
    group's routes without their header; the shared-memory caller of every request in its scope."""

    def __init__(self, app: ASGIApp, restrictions: Mapping[str, tuple[str, str]]) -> None:
        self.app = app
        self.restrictions = dict(restrictions)
        self.shared_memory = self.restrictions.get(SHARED_MEMORY_GROUP)
        self.keys = frozenset(header for header, _ in self.restrictions.values())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            group = group_of(scope["path"]) if self.restrictions else None
            peer = scope.get(PEER_SCOPE_KEY)
            # On the Unix socket the peer's credentials stand in for the shared-memory key: every object is
            # judged by them. Every other restricted group needs its header on both listeners.
            exempt = group == SHARED_MEMORY_GROUP and peer is not None
            # Paths outside every group (tables, /healthz, the docs) never read a key: their duplicates are no matter.
            repeated = repeated_key((key.decode("latin-1") for key, _ in scope.get("headers", ())), self.keys) \
                if group is not None else None
            if repeated is not None:
                message = duplicate_key_message(repeated)
                response = error_response(BadRequest.status_code, BadRequest.error_type, message)
                await response(scope, receive, send)
                return
            if group in self.restrictions and not exempt and not _carries(scope, self.restrictions[group]):
                message = restricted_message(scope["path"], group, self.restrictions[group][0])
                response = error_response(Forbidden.status_code, Forbidden.error_type, message)
                await response(scope, receive, send)
                return
            has_key = self.shared_memory is not None and _carries(scope, self.shared_memory)
            scope[CALLER_SCOPE_KEY] = SharedMemoryCaller(peer, has_key, scope.get(DESCRIPTORS_SCOPE_KEY))
        await self.app(scope, receive, send)


def shared_memory_caller(scope: Scope) -> SharedMemoryCaller:
    """The caller the middleware recorded (none recorded: an app without it, treated as an unknown TCP client)."""
    caller = scope.get(CALLER_SCOPE_KEY)
    if isinstance(caller, SharedMemoryCaller):
        return caller
    return SharedMemoryCaller(scope.get(PEER_SCOPE_KEY), False, scope.get(DESCRIPTORS_SCOPE_KEY))
