"""Shared fixtures, and the markers that say what a test needs, given by the folder it lives in.

Folders: models/ (the numeric core), api/ (the HTTP surface through TestClient, the CLI), inference/ (the
engine, batcher, KServe codec, shared memory), server/ (real servers on loopback: marked `server`),
deploy/ (container and Kubernetes files, the wheel), parity/ (against torch, transformers and onnx: marked
`torch`), rules/ (house rules of the code base), converters/ (artifacts of the real third-party converters audited:
marked `converters` and `torch`, run by scripts/converter-matrix-test.sh alone). Each folder's conftest.py names its
markers.

Without torch, `pytest -m "not torch"` runs everything else and parity/ is not even imported (its modules
import torch at the top). A plain `pytest` without torch stops with a usage error instead of silently
skipping the parity suites.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save_file

from posenc.models.rope import make_rope_parameters, rope_cos_sin
from posenc.service.http.app import create_app
from posenc.service.inference.runtime.sessions import share_sessions
from posenc.service.request_kit.descriptors import DESCRIPTORS_SCOPE_KEY, PassedDescriptors
from posenc.service.request_kit.restricted import SharedMemoryCaller
from posenc.service.request_kit.unix import PEER_SCOPE_KEY, Peer
from posenc.service.settings import Settings
from posenc.service.testing import SHARED_MEMORY_HEADERS, shared_memory_key_settings

TESTS = Path(__file__).resolve().parent
HAS_TORCH = all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers", "onnx"))


def assert_runs_in_fresh_python(code: str) -> None:
    """`code`, run by a new interpreter at the repository root (none of this process's imports loaded there),
    exits 0; its stderr is the failure message."""
    result = subprocess.run([sys.executable, "-c", code], cwd=TESTS.parent, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def pytest_configure(config: pytest.Config) -> None:
    # Every app and server of a run picks the same graph for the same request: the lengths config.json names,
    # not a calibration per process on a loaded machine (tests/inference/test_calibration.py covers calibrate).
    os.environ.setdefault("POSENC_CPU_FORM_FROM", "config")
    # An app per test, and one onnxruntime session per model file, threads and providers for all of them: each
    # app's engine would otherwise build the shipped models' 30 sessions again (a third of the suite's time).
    share_sessions()
    if not HAS_TORCH and "not torch" not in (config.option.markexpr or ""):
        raise pytest.UsageError("torch, transformers and onnx are not installed: install the test extra "
                                "(pip install -e '.[test]') or run the tests that do not need them: "
                                "pytest -m \"not torch\"")


# The markers each folder gives its tests (a folder not named here gives none).
FOLDER_MARKS: dict[str, tuple[str, ...]] = {"parity": ("torch",), "server": ("server",),
                                         "converters": ("converters", "torch")}


def _top_folder(path: Path) -> str | None:
    """The folder directly below tests/ that `path` lies in, if any."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 or path.is_dir() else None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Folders that cannot hold a selected test are not imported: parity/ without torch (its imports would
    fail), and, under `-m NAME` for a folder marker, every folder that does not give NAME."""
    if not collection_path.is_dir() or collection_path.resolve().parent != TESTS:
        return None
    marks = FOLDER_MARKS.get(collection_path.name, ())
    if not HAS_TORCH and "torch" in marks:
        return True
    selected = (config.option.markexpr or "").strip()
    folder_marks = {mark for names in FOLDER_MARKS.values() for mark in names}
    return True if selected in folder_marks and selected not in marks else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for mark in FOLDER_MARKS.get(_top_folder(item.path) or "", ()):
            item.add_marker(getattr(pytest.mark, mark))


CHECK_ROPE = "/v1/rope?max_position=48&head_dim=16"  # the golden table of the `posenc check` tests


@pytest.fixture
def gptj_pairs(tmp_path: Path) -> Path:
    """cos and sin of CHECK_ROPE in GPT-J's interleaved layout: a table with the layout mistake planted."""
    cos, sin, _ = rope_cos_sin(make_rope_parameters(head_dim=16), 48, layout="interleaved")
    path = tmp_path / "mine.safetensors"
    save_file({"cos": cos, "sin": sin}, str(path))
    return path


@contextmanager
def running_client(**overrides: object) -> Iterator[TestClient]:
    """A TestClient on `create_app(Settings(**overrides))` with its lifespan run (models loaded)."""
    with TestClient(create_app(Settings(**overrides))) as client:  # type: ignore[arg-type]
        yield client


# Shared-memory callers for the registry's own tests: a TCP client with the key, and this very process as a
# Unix-socket peer.
TRUSTED = SharedMemoryCaller(None, has_key=True)
SELF_PEER = SharedMemoryCaller(Peer(os.getpid(), os.getuid(), frozenset(os.getgroups()) | {os.getgid()}),
                               has_key=False)


class Resent(PassedDescriptors):
    """A descriptor a peer sends along with every request (each `take` a new copy, as SCM_RIGHTS gives the
    server its own descriptor each time)."""

    def __init__(self, fd: int) -> None:
        super().__init__([fd])
        self.fd = fd

    def take(self) -> int | None:
        return os.dup(self.fd)

    def close(self) -> None:
        pass  # the test's own descriptor: the test closes it


def peer_sending(fd: int, caller: SharedMemoryCaller = SELF_PEER) -> SharedMemoryCaller:
    """`caller` (a Unix-socket peer) sending descriptor `fd` with each request, for `fd:N` keys."""
    return replace(caller, descriptors=Resent(fd))


class AsPeer:
    """An ASGI app seen from a Unix-socket peer: every request's scope carries `peer`, as the server's
    protocol puts it there on the socket."""

    def __init__(self, app: Any, peer: Peer, descriptors: PassedDescriptors | None = None) -> None:
        self.app, self.peer, self.state, self.descriptors = app, peer, app.state, descriptors

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            scope = {**scope, PEER_SCOPE_KEY: self.peer, DESCRIPTORS_SCOPE_KEY: self.descriptors}
        await self.app(scope, receive, send)


@contextmanager
def shared_memory_client(peer: SharedMemoryCaller | None = None, **overrides: object) -> Iterator[TestClient]:
    """A running TestClient with shared memory on: a TCP client sending the test kit's key, or (`peer`) a
    Unix-socket peer with that caller's credentials and no key."""
    settings = Settings(shared_memory=True, **shared_memory_key_settings(), **overrides)  # type: ignore[arg-type]
    app = create_app(settings)
    if peer is not None:
        assert peer.peer is not None
        with TestClient(AsPeer(app, peer.peer, peer.descriptors)) as client:  # type: ignore[arg-type]
            yield client
        return
    with TestClient(app) as client:
        client.headers.update(SHARED_MEMORY_HEADERS)
        yield client


Request = tuple[str, str, Mapping[str, str] | None, bytes | None, Mapping[str, str] | None]  # method, path,
# query, body, headers


def send_all(client: TestClient, requests: Sequence[Request]) -> list[httpx2.Response]:
    """`requests` sent one after the other to the app of a running `client`, on the app's own event loop:
    no thread hop per request, so thousands of small requests take a third of TestClient's time. An
    exception in the app comes back as a 500 response."""
    async def send() -> list[httpx2.Response]:
        transport = httpx2.ASGITransport(app=client.app, raise_app_exceptions=False)  # type: ignore[arg-type]
        async with httpx2.AsyncClient(transport=transport, base_url="http://testserver") as asgi:
            return [await asgi.request(method, path, params=query, content=body, headers=headers)
                    for method, path, query, body, headers in requests]

    assert client.portal is not None, "send_all needs a running client (inside `with running_client()`)"
    return client.portal.call(send)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with running_client() as c:
        yield c
