"""The benchmark's server: posenc, plus a bare ASGI echo at `POST /bench/echo` in the same process, run by
posenc's own server (its protocol class, timeouts and body reading: what `posenc serve` runs).

    POSENC_...=... python -m bench.echo_asgi --host 127.0.0.1 --port 8000

The echo is the transport anchor of `python -m bench infer` (bench/infer.py): it reads the request body (N
bytes, into one buffer sized from Content-Length, the way an inference body is read: through the server's
RECEIVE_INTO when it offers one) and answers `X-Echo-Bytes` bytes (M), with no routing, middleware or parsing.
Run on the same server, loop, protocol and process as posenc, the difference between the two is what posenc
itself adds.
"""

from __future__ import annotations

import argparse
from functools import cache
from typing import Any

from starlette.types import Receive, Scope, Send

from posenc.service.http.app import app_from_env
from posenc.service.http.server import Server, build_config
from posenc.service.request_kit.bodies import receive_into_of
from posenc.service.settings import Settings

ECHO_PATH = "/bench/echo"
ANSWER_HEADER = b"x-echo-bytes"


@cache
def _payload(size: int) -> bytes:
    return bytes(size)


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    headers = dict(scope["headers"])
    buffer = bytearray(int(headers.get(b"content-length", b"0")))
    receive_into = receive_into_of(scope)
    if receive_into is not None:
        if await receive_into(memoryview(buffer)) != len(buffer):
            return
    else:
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


def main(argv: list[str] | None = None) -> int:
    """posenc's server (`posenc serve` with the POSENC_* of the environment) running `posenc_with_echo`."""
    parser = argparse.ArgumentParser(prog="python -m bench.echo_asgi")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    config = build_config(Settings(host=args.host, port=args.port))
    config.app = f"{__name__}:posenc_with_echo"  # a factory, like posenc's own
    server = Server(config)
    server.run()
    return server.exit_status


if __name__ == "__main__":
    raise SystemExit(main())
