"""`posenc table`: write any v1 table to a file without a network server.

The endpoint's registered query model validates the NAME=VALUE pairs, and the table path the HTTP
routes use (`TableRequest.answer`) computes and encodes the answer: same parameters, same numbers,
same errors, byte for byte the body the HTTP API returns.

    posenc table /v1/sinusoidal max_position=8 dim=16 variant=fairseq --output pe.safetensors
    posenc table /v1/rope max_position=4096 head_dim=128 --output cos.npy --tensor cos
    posenc table /v1/rope/from-config --body config.json --output rope.safetensors
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from pydantic import ValidationError

from posenc.models.errors import ParameterError
from posenc.service.codec.encode import FILE_SUFFIX, FORMATS, negotiate_format
from posenc.service.errors import InvalidParameter, ServiceError, describe_validation_errors
from posenc.service.settings import Settings
from posenc.service.tables import TABLES
from posenc.service.tables.answer import TableRequest
from posenc.service.tables.cache import ByteLRUCache
from posenc.service.tables.registry import TableQuery, TableRoute, table_routes

SUFFIX_FORMAT = {suffix: fmt for fmt, suffix in FILE_SUFFIX.items()} | {".raw": "raw"}
BODY_MEDIA_TYPES = {".json": "application/json", ".safetensors": "application/x-safetensors",
                    ".npy": "application/x-npy"}


class TableCliError(Exception):
    """A usage problem or an error answer; the message is printed, the exit status is `status`."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


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


def parse_request(endpoint: str, params: list[str]) -> tuple[TableRoute, dict[str, str]]:
    """The registered route and its query parameters, from the endpoint (which may carry `?a=b`) and
    `NAME=VALUE` items."""
    if not endpoint.startswith("/"):
        endpoint = "/" + (endpoint if endpoint.startswith("v1/") else "v1/" + endpoint)
    split = urlsplit(endpoint)
    if not split.path.startswith("/v1/"):
        raise TableCliError(f"posenc table: {split.path!r} is not a v1 table endpoint (/v1/...)", status=2)
    route = table_routes().get(split.path)
    if route is None:
        raise TableCliError(f"posenc table: no route {split.path}; table endpoints: {', '.join(TABLES)}", status=2)
    query = dict(parse_qsl(split.query, keep_blank_values=True))
    for item in params:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise TableCliError(f"posenc table: parameter {item!r} is not NAME=VALUE", status=2)
        if name in ("format", "tensor"):
            raise TableCliError(f"posenc table: use --{name} instead of {name}=", status=2)
        query[name] = value
    return route, query


def validate_query(route: TableRoute, values: dict[str, Any]) -> TableQuery:
    """The query model of `route` from string values, validated as the HTTP route validates it."""
    try:
        return route.query.model_validate(values)
    except ValidationError as exc:
        raise InvalidParameter(describe_validation_errors(exc.errors())) from None


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


def read_body(path: str) -> tuple[bytes, str | None]:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TableCliError(f"posenc table: cannot read --body {path}: {exc.strerror}", status=2) from None
    return data, BODY_MEDIA_TYPES.get(Path(path).suffix.lower(), "application/octet-stream")


def answer(route: TableRoute, query_values: dict[str, str], fmt: str, tensor: str | None,
           body: tuple[bytes, str | None] | None, settings: Settings) -> bytes:
    """The body the HTTP API would answer (ServiceError / ParameterError as it would refuse)."""
    query = validate_query(route, query_values)
    table = TableRequest(format=negotiate_format(fmt, None), tensor=tensor, settings=settings,
                         cache=ByteLRUCache(0), method=route.method)
    if route.query.body is not None:
        query.check()
        data, content_type = body if body is not None else (b"", None)
        query = query.bind(route.query.body.decode(data, content_type))
    return table.answer(query).body


def run(args: argparse.Namespace) -> int:
    """Handler of `posenc table`: 0 on success, 1 when the service answers an error, 2 on bad usage."""
    from posenc.service.cli.settings_from_env import settings_or_exit

    try:
        fmt = resolve_format(args.output, args.format)
        route, query = parse_request(args.endpoint, list(args.params))
        body = read_body(args.body) if args.body is not None else None
        settings = settings_or_exit(access_log=False)
        try:
            data = answer(route, query, fmt, args.tensor, body, settings)
        except ServiceError as exc:
            raise TableCliError(f"posenc table: {exc.message} (HTTP {exc.status_code})") from None
        except ParameterError as exc:
            raise TableCliError(f"posenc table: {exc} (HTTP 422)") from None
        write_output(args.output, data)
    except TableCliError as exc:
        sys.stderr.write(f"{exc}\n")
        return exc.status
    if args.output != "-":
        sys.stderr.write(f"posenc table: wrote {len(data)} bytes ({fmt}) to {args.output}\n")
    return 0
