"""The benchmark's server: posenc, plus a bare ASGI echo at `POST /bench/echo` in the same process.

    python -m uvicorn bench.echo_asgi:posenc_with_echo --factory ...

The echo is the transport anchor of `python -m bench infer` (bench/infer.py): it reads the request body (N
bytes, into one buffer sized from Content-Length) and answers `X-Echo-Bytes` bytes (M), with no routing,
middleware or parsing.
Run on the same uvicorn, loop, protocol and process as posenc, the difference between the two is what
posenc itself adds.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from starlette.types import Receive, Scope, Send

from posenc.service.http.app import app_from_env

ECHO_PATH = "/bench/echo"
ANSWER_HEADER = b"x-echo-bytes"


@cache
def _payload(size: int) -> bytes:
    return bytes(size)


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    headers = dict(scope["headers"])
    buffer = bytearray(int(headers.get(b"content-length", b"0")))
    view, received, more = memoryview(buffer), 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        view[received:received + len(chunk)] = chunk
        received += len(chunk)
        more = message.get("more_body", False)
    body = _payload(int(headers.get(ANSWER_HEADER, b"0")))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/octet-stream"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def posenc_with_echo() -> Any:
    """uvicorn factory: posenc from the environment (POSENC_*), with the echo in front of it."""
    posenc = app_from_env()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == ECHO_PATH:
            await echo(scope, receive, send)
        else:
            await posenc(scope, receive, send)

    return app
