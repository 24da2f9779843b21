"""Golden tables in-process: `posenc.table("/v1/rope", max_position=..., head_dim=...)` answers through the app
itself (no server, no socket), decoded by the client (`posenc.service.client`), so the arrays are exactly what
the HTTP API serves. The pytest fixture `posenc_table` is `app_table` on the test's app.

Needs httpx2 (FastAPI's TestClient runs on it): the `client` extra.
"""

from __future__ import annotations

import functools
from typing import Any

from starlette.types import ASGIApp

from posenc.service.client import Client, Table
from posenc.service.settings import Settings


def app_client(app: ASGIApp) -> Client:
    """A client of `app` in-process. The app's lifespan is not run: tables need no model."""
    try:
        from fastapi.testclient import TestClient
    except ImportError:  # starlette's TestClient imports httpx2
        raise ImportError("posenc.table needs httpx2: pip install 'posenc[client]'") from None
    return Client(http=TestClient(app))


def app_table(app: ASGIApp, path: str, /, *, body: Any = None, **params: Any) -> Table:
    """The table of `path` with these parameters, answered by `app`: {tensor name: read-only np.ndarray} with
    `.metadata` (see `posenc.service.client.Client.table`)."""
    return app_client(app).table(path, body=body, **params)


@functools.cache
def _default_client() -> Client:
    from posenc.service.http.app import create_app

    return app_client(create_app(Settings()))


def table(path: str, /, *, body: Any = None, **params: Any) -> Table:
    """`app_table` on one app per process with the default settings (POSENC_* read on the first call)."""
    return _default_client().table(path, body=body, **params)
