"""`posenc table`: write any v1 table to a file without a network server.

The request goes through the very same app (`create_app`) in-process, by calling it as an ASGI
application with a hand-built scope: same routes, same validation, same numbers, same errors.

    posenc table /v1/sinusoidal max_position=8 dim=16 variant=fairseq --output pe.safetensors
    posenc table /v1/rope max_position=4096 head_dim=128 --output cos.npy --tensor cos
    posenc table /v1/rope/from-config --body config.json --output rope.safetensors
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from service.arrays import FILE_SUFFIX, FORMATS

SUFFIX_FORMAT = {suffix: fmt for fmt, suffix in FILE_SUFFIX.items()} | {".raw": "raw"}
BODY_MEDIA_TYPES = {".json": "application/json", ".safetensors": "application/x-safetensors",
                    ".npy": "application/x-npy"}


class TableCliError(Exception):
    """A usage problem or an error answer; the message is printed, the exit status is `status`."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class AsgiResponse:
    status: int = 500
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)


def add_parser(commands: Any) -> None:
    """Register `posenc table` on the CLI's subcommands."""
    p = commands.add_parser(
        "table", help="write a v1 table to a file (no server; same parameters and numbers as the HTTP API)",
        description="Write the table of a v1 endpoint to a file: "
                    "posenc table /v1/sinusoidal max_position=8 dim=16 --output pe.safetensors",
    )
    p.add_argument("endpoint", help="endpoint path, e.g. /v1/sinusoidal, /v1/rope, /v1/alibi/bias")
    p.add_argument("params", nargs="*", metavar="NAME=VALUE", help="query parameters of the endpoint")
    p.add_argument("-o", "--output", required=True, help="file to write ('-' = standard output)")
    p.add_argument("--format", choices=FORMATS, help="wire format (default: from the output suffix, "
                   "else safetensors)")
    p.add_argument("--tensor", help="the one tensor to write (npy/raw of a multi-tensor endpoint)")
    p.add_argument("--body", help="request body file for POST endpoints (.json, .safetensors or .npy)")
    p.set_defaults(handler=run)


def resolve_format(output: str, explicit: str | None) -> str:
    """`--format` wins; else the output file's suffix; else safetensors."""
    if explicit:
        return explicit
    return SUFFIX_FORMAT.get(Path(output).suffix.lower(), "safetensors")


def build_query(endpoint: str, params: list[str], fmt: str, tensor: str | None) -> tuple[str, bytes]:
    """(path, query string) from the endpoint (which may carry `?a=b` itself) and `NAME=VALUE` items."""
    if not endpoint.startswith("/"):
        endpoint = "/" + (endpoint if endpoint.startswith("v1/") else "v1/" + endpoint)
    split = urlsplit(endpoint)
    if not split.path.startswith("/v1/"):
        raise TableCliError(f"posenc table: {split.path!r} is not a v1 table endpoint (/v1/...)", status=2)
    pairs: list[tuple[str, str]] = []
    for item in params:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise TableCliError(f"posenc table: parameter {item!r} is not NAME=VALUE", status=2)
        if name in ("format", "tensor"):
            raise TableCliError(f"posenc table: use --{name} instead of {name}=", status=2)
        pairs.append((name, value))
    pairs.append(("format", fmt))
    if tensor:
        pairs.append(("tensor", tensor))
    query = "&".join(q for q in (split.query, urlencode(pairs)) if q)
    return split.path, query.encode()


async def call_app(app: Any, method: str, path: str, query: bytes, body: bytes, content_type: str | None
                   ) -> AsgiResponse:
    """One HTTP request straight into the ASGI app (no sockets, no lifespan: tables need no models)."""
    headers = [(b"host", b"posenc-cli"), (b"content-length", str(len(body)).encode())]
    if content_type:
        headers.append((b"content-type", content_type.encode()))
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": method, "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": query, "headers": headers, "client": None, "server": ("posenc-cli", 0),
             "state": {}}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    response = AsgiResponse()

    async def receive() -> dict[str, Any]:
        # After the body, a client that never disconnects: park until the app is done.
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            response.status = int(message["status"])
            response.headers = {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1")
                                for k, v in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            response.body += message.get("body", b"")

    await app(scope, receive, send)
    return response


def error_message(response: AsgiResponse) -> str:
    """The envelope's message (`{"error": ...}`), else the body as text."""
    try:
        doc = json.loads(bytes(response.body))
        return str(doc["error"])
    except (ValueError, KeyError, TypeError):
        return bytes(response.body).decode("utf-8", "replace")[:500]


def write_output(output: str, data: bytes) -> None:
    """Write atomically (a temp file beside the target, then rename): no half-written tables."""
    if output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    target = Path(output)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        # mkstemp makes the file private; a table is an ordinary file: honour the umask instead.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_body(path: str | None) -> tuple[bytes, str | None]:
    if path is None:
        return b"", None
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TableCliError(f"posenc table: cannot read --body {path}: {exc.strerror}", status=2) from None
    return data, BODY_MEDIA_TYPES.get(Path(path).suffix.lower(), "application/octet-stream")


def run(args: argparse.Namespace) -> int:
    """Handler of `posenc table`: 0 on success, 1 when the service answers an error, 2 on bad usage."""
    from service.app import create_app
    from service.cli import settings_or_exit

    try:
        fmt = resolve_format(args.output, args.format)
        path, query = build_query(args.endpoint, list(args.params), fmt, args.tensor)
        body, content_type = read_body(args.body)
        app = create_app(settings_or_exit(access_log=False))
        method = "POST" if args.body is not None else "GET"
        response = asyncio.run(call_app(app, method, path, query, body, content_type))
        if response.status != 200:
            raise TableCliError(f"posenc table: {error_message(response)} (HTTP {response.status})")
        write_output(args.output, bytes(response.body))
    except TableCliError as exc:
        sys.stderr.write(f"{exc}\n")
        return exc.status
    if args.output != "-":
        sys.stderr.write(f"posenc table: wrote {len(response.body)} bytes ({fmt}) to {args.output}\n")
    return 0
