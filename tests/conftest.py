"""Shared fixtures, and the markers that say what a test needs.

`torch`: torch, transformers or onnx (the export extra): the parity tests and the exporter. Without
torch, `pytest -m "not torch"` runs everything else; the modules marked `torch` are not even imported
(they import torch at the top). A plain `pytest` without torch stops with a usage error instead of
silently skipping the parity suites.
`server`: a real uvicorn server on loopback (the protocol itself is under test).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx2
import pytest
from fastapi.testclient import TestClient

from service.http.app import create_app
from service.settings import Settings

TORCH_MARK = "pytestmark = pytest.mark.torch"
HAS_TORCH = all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers", "onnx"))


def pytest_configure(config: pytest.Config) -> None:
    if not HAS_TORCH and "not torch" not in (config.option.markexpr or ""):
        raise pytest.UsageError("torch, transformers and onnx are not installed: install the test extra "
                                "(pip install -e '.[test]') or run the tests that do not need them: "
                                "pytest -m \"not torch\"")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without torch, modules marked `torch` are not imported (their imports would fail)."""
    if HAS_TORCH or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    return True if TORCH_MARK in collection_path.read_text() else None


@contextmanager
def running_client(**overrides: object) -> Iterator[TestClient]:
    """A TestClient on `create_app(Settings(**overrides))` with its lifespan run (models loaded)."""
    with TestClient(create_app(Settings(**overrides))) as client:  # type: ignore[arg-type]
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
