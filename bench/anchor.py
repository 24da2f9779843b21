"""The anchor of the table ratios: a bare FastAPI app serving, from `async def` endpoints, the bytes and headers
captured from posenc. BENCH_ANCHOR_SPEC names a JSON file:
`{"raw": {path: {"file", "media_type", "headers"}}, "json": {path: object}}`.

    BENCH_ANCHOR_SPEC=spec.json python -m uvicorn bench.anchor:create_app --factory --loop uvloop --http httptools
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Response


def _raw(content: bytes, media_type: str, headers: dict[str, str]) -> Callable[[], Awaitable[Response]]:
    async def endpoint() -> Response:
        return Response(content=content, media_type=media_type, headers=headers)
    return endpoint


def _json(obj: Any) -> Callable[[], Awaitable[Any]]:
    async def endpoint() -> Any:
        return obj
    return endpoint


def create_app() -> FastAPI:
    """uvicorn factory: the endpoints of the spec file named by BENCH_ANCHOR_SPEC."""
    spec = json.loads(Path(os.environ["BENCH_ANCHOR_SPEC"]).read_text())
    app = FastAPI()
    for path, entry in spec["raw"].items():
        content = Path(entry["file"]).read_bytes()
        app.add_api_route(path, _raw(content, entry["media_type"], entry["headers"]), methods=["GET"])
    for path, obj in spec["json"].items():
        app.add_api_route(path, _json(obj), methods=["GET"])
    return app
