"""Every route that runs a model or touches shared memory is in a restricted protocol group, and a group's
header is needed on the Unix socket too (only shared memory is judged there by the peer's credentials)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from posenc.service.errors import Forbidden
from posenc.service.http.app import create_app
from posenc.service.inference.deps import dataplane_of
from posenc.service.request_kit.restricted import GROUP_ROUTES, group_of, repeated_key, shared_memory_caller
from posenc.service.request_kit.unix import PEER_SCOPE_KEY, Peer
from posenc.service.settings import Settings
from posenc.service.testing import kserve_request
from tests.conftest import AsPeer
from tests.onnx_models import random_inputs

ALL_GROUPS = ",".join(GROUP_ROUTES)
RESTRICTED = {"restricted_api": f"{ALL_GROUPS}:x-key=secret", "shared_memory": True}
REACHES = (dataplane_of,)
PATH_VALUES = {"name": "rope_attention", "version": "1", "preset": "llama3"}


def _calls(route: Any) -> Iterator[Callable[..., Any]]:
    """The endpoint and every dependency of `route`, however deep."""
    yield route.endpoint
    stack = list(route.dependant.dependencies) if isinstance(route, APIRoute) else []
    while stack:
        dependant = stack.pop()
        if dependant.call is not None:
            yield dependant.call
        stack += dependant.dependencies


def _reaches_a_model_or_shared_memory(route: Any) -> bool:
    """Whether the route gets the engine (which runs models) or the shared-memory registry: as a dependency,
    or called by one (a dependency that gathers several, like the infer route's)."""
    for call in _calls(route):
        if call in REACHES:
            return True
        try:
            source = inspect.getsource(call)
        except (OSError, TypeError):
            continue
        if any(f"{reach.__name__}(" in source for reach in REACHES):
            return True
    return False


def _flat(routes: Any) -> Iterator[Any]:
    """Every route, with those of included routers (included without a prefix, as the app does)."""
    for route in routes:
        inner = getattr(route, "original_router", None) or (route if hasattr(route, "routes") else None)
        if inner is not None:
            yield from _flat(inner.routes)
        elif hasattr(route, "endpoint"):
            yield route


def _routes_in_the_document(app: Any) -> list[tuple[str, str, Any]]:
    """(method, path, route) of every operation of the OpenAPI document."""
    by_id = {route.unique_id: route for route in _flat(app.routes) if isinstance(route, APIRoute)}
    found = []
    for path, operations in app.openapi()["paths"].items():
        for method, operation in operations.items():
            found.append((method.upper(), path, by_id[operation["operationId"]]))
    return found


def test_every_route_that_runs_a_model_or_touches_shared_memory_is_in_a_group() -> None:
    app = create_app(Settings(**RESTRICTED))  # type: ignore[arg-type]
    routes = _routes_in_the_document(app)
    reaching = [(method, path) for method, path, route in routes if _reaches_a_model_or_shared_memory(route)]
    assert ("POST", "/v2/models/{name}/check") in reaching and ("POST", "/v2/models/{name}/infer") in reaching
    outside = [(method, path) for method, path in reaching if group_of(path.format(**PATH_VALUES)) is None]
    assert outside == [], f"routes that run a model or touch shared memory outside every group: {outside}"
    with TestClient(app) as client:
        for method, path in reaching:  # and the group is enforced: no header, no run
            answer = client.request(method, path.format(**PATH_VALUES), content=b"{}")
            assert answer.status_code == 403 and "x-key" in answer.json()["error"], (method, path, answer.text)


def test_a_model_check_needs_the_inference_header() -> None:
    """The probe: POSENC_RESTRICTED_API='inference:X-K=v' and a check without the header ran the model (200)."""
    with TestClient(create_app(Settings(restricted_api="inference:X-K=v"))) as client:  # type: ignore[arg-type]
        inputs = random_inputs(8, 8, 64, 1, 1)  # the query has the output's shape
        body = kserve_request({**inputs, "expected_output": inputs["query"]}, binary=False).body
        answer = client.post("/v2/models/rope_attention/check", content=body)
        assert answer.status_code == 403 and "'inference'" in answer.json()["error"]
        answer = client.post("/v2/models/rope_attention/check", content=body, headers={"X-K": "v"})
        assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("group", ["inference", "statistics", "metadata", "model-config", "model-repository"])
def test_a_unix_socket_peer_needs_every_other_groups_header(group: str) -> None:
    """The socket's peer is judged by its credentials for shared memory only: any other restricted group
    still needs its header."""
    settings = Settings(restricted_api=f"{group},shared-memory:x-key=secret", shared_memory=True)  # type: ignore[arg-type]
    peer = Peer(os.getpid(), os.getuid(), frozenset({os.getgid()}))
    path = next(path.format(**PATH_VALUES) for method, path, _ in _routes_in_the_document(create_app(settings))
                if group_of(path.format(**PATH_VALUES)) == group)
    method = "POST" if group in ("inference", "model-repository") else "GET"
    with TestClient(AsPeer(create_app(settings), peer)) as client:  # type: ignore[arg-type]
        answer = client.request(method, path, content=b"{}")
        assert answer.status_code == 403 and f"'{group}'" in answer.json()["error"], (path, answer.text)
        assert client.get("/v2/systemsharedmemory/status").status_code == 200  # the peer's credentials decide


def test_a_request_the_middleware_never_saw_is_an_unknown_tcp_client() -> None:
    """An app without RestrictedApi in front (none of posenc's; a user's own assembly) holds no key: it may not use
    shared memory."""
    caller = shared_memory_caller({"type": "http", "path": "/v2/systemsharedmemory/region/r/register"})
    assert caller.peer is None and not caller.has_key
    with pytest.raises(Forbidden, match="shared memory over TCP needs the header"):
        caller.require("register")
    peer = Peer(pid=1, uid=1000, gids=frozenset({1000}))
    assert shared_memory_caller({"type": "http", PEER_SCOPE_KEY: peer}).owner == "uid 1000"


@pytest.mark.parametrize(("headers", "repeated"), [
    (["X-K", "x-k"], "x-k"), (["x-k", "X-K"], "x-k"), (["X-K", "X-k"], "x-k"), (["x-k", "other", "x-k"], "x-k"),
    (["X-K"], None), (["x-k", "x-other", "X-Other"], None),
])
def test_a_key_sent_twice_is_found_in_any_case(headers: list[str], repeated: str | None) -> None:
    """Header names are case-insensitive (metadata keys arrive lower-cased, HTTP header names as sent): the same
    key in two spellings is the key sent twice."""
    assert repeated_key(headers, {"x-k"}) == repeated
