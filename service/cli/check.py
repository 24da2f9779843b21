"""`posenc check`: compare a file of your tensors with a golden table and print the diagnosis.

    posenc check '/v1/rope?max_position=4096&head_dim=128' --file mine.safetensors
    posenc check /v1/sinusoidal max_position=512 dim=64 --file pe.npy --url http://127.0.0.1:8000

Without `--url` the check runs in this process as the same `CheckRequest` the HTTP route runs
(`posenc.service.check.request`); with it, the running service answers. Exit status: 0 matches, 1 mismatch,
2 bad usage or a refused request (the message says why), so a CI job can call it as a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from posenc.models.errors import ParameterError
from posenc.service.cli.remote import RemoteError, post
from posenc.service.cli.table import TableCliError, parse_request, validate_query
from posenc.service.errors import ServiceError
from posenc.service.tables.registry import TableRoute

UPLOAD_TYPES = {".npy": "application/x-npy", ".safetensors": "application/x-safetensors"}


def add_parser(commands: Any) -> None:
    """Register `posenc check` on the CLI's subcommands."""
    p = commands.add_parser(
        "check", help="check your table against the golden one and name the likely porting mistake",
        description="posenc check '/v1/rope?max_position=64&head_dim=32' --file mine.safetensors "
                    "(exit status 0: matches, 1: mismatch, 2: bad usage or refused)",
    )
    p.add_argument("endpoint", help="the table endpoint with its parameters, e.g. '/v1/rope?max_position=64&"
                                    "head_dim=32' (a /v1/check/... path is accepted too)")
    p.add_argument("params", nargs="*", metavar="NAME=VALUE", help="more query parameters of the endpoint")
    p.add_argument("--file", required=True, help="your tensors: .safetensors (named as the endpoint's tensors) or "
                                                  ".npy (one tensor, see --tensor)")
    p.add_argument("--tensor", help="which tensor a .npy file holds (default: the endpoint's first)")
    p.add_argument("--config", help="JSON body of a POST table (rope/from-config: the config.json file)")
    p.add_argument("--url", help="base URL of a running service (default: check in this process)")
    p.add_argument("--json", action="store_true", help="print the whole JSON answer instead of the summary")
    p.set_defaults(handler=run)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TableCliError(f"posenc check: cannot read {what} {path}: {exc.strerror}", status=2) from None


def in_process(route: TableRoute, values: dict[str, str], body: bytes, content_type: str,
               tensor: str | None, config: str | None) -> dict[str, Any]:
    """The JSON answer of the check route, computed here (same validation, same errors)."""
    from posenc.service.check.request import CheckRequest  # the check's modules load only when a check runs here
    from posenc.service.cli.settings_from_env import settings_or_exit

    settings = settings_or_exit(access_log=False)
    check = CheckRequest.build(route, validate_query(route, values), tensor=tensor, config=config, settings=settings)
    if len(body) > check.max_request_bytes:
        raise TableCliError(f"posenc check: {len(body)} bytes; the limit is {check.max_request_bytes} "
                            "(POSENC_MAX_REQUEST_BYTES)", status=2)
    return check.report(body, content_type).document()


def remote(base: str, route: TableRoute, values: dict[str, str], body: bytes, content_type: str,
           tensor: str | None, config: str | None) -> dict[str, Any]:
    extra = {k: v for k, v in {"tensor": tensor, "config": config}.items() if v is not None}
    url = base.rstrip("/") + "/v1/check/" + route.path.removeprefix("/v1/") + "?" + urlencode({**values, **extra})
    try:
        answer: dict[str, Any] = json.loads(post(url, body, content_type))
    except RemoteError as exc:
        raise TableCliError(f"posenc check: {exc}", status=2) from None
    return answer


def _short(value: float | str) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else value


def render(endpoint: str, doc: dict[str, Any]) -> str:
    """The answer as a few lines: verdict, agreement per tensor, the ranked diagnosis, the golden request."""
    lines = [f"{endpoint}: {doc['summary']}"]
    for name, a in doc["agreement"].items():
        ulps = "" if a["max_ulp"] is None else f" ({_short(a['max_ulp'])} ulp)"
        first = "" if a["first_failure"] is None else f", first over the contract at {a['first_failure']}"
        lines.append(f"  {name}: max abs error {_short(a['max_abs'])}{ulps}, "
                     f"exact {100 * a['exact_match_rate']:.1f}%{first}")
    lines.append("diagnosis (best first; * = explains your table within the contract):")
    for entry in doc["diagnosis"][:5]:
        mark = "*" if entry["explains"] else " "
        found = "".join(f" [{key} = {value}]" for key, value in entry.get("found", {}).items())
        lines.append(f"  {mark} {entry['name']:<24} residual {_short(entry['residual']):<9}  "
                     f"{entry['explanation']}{found}")
    golden = doc["golden_table"]
    lines.append(f"golden table: {golden['method']} {golden['url']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Handler of `posenc check`."""
    try:
        endpoint = args.endpoint.replace("/v1/check/", "/v1/", 1)
        route, values = parse_request(endpoint, list(args.params))
        body = _read(args.file, "--file")
        content_type = UPLOAD_TYPES.get(Path(args.file).suffix.lower(), "application/octet-stream")
        config = _read(args.config, "--config").decode("utf-8", "replace") if args.config else None
        try:
            if args.url:
                doc = remote(args.url, route, values, body, content_type, args.tensor, config)
            else:
                doc = in_process(route, values, body, content_type, args.tensor, config)
        except ServiceError as exc:
            raise TableCliError(f"posenc check: {exc.message} (HTTP {exc.status_code})", status=2) from None
        except ParameterError as exc:
            raise TableCliError(f"posenc check: {exc} (HTTP 422)", status=2) from None
    except TableCliError as exc:
        sys.stderr.write(f"{str(exc).replace('posenc table:', 'posenc check:')}\n")
        return 2
    print(json.dumps(doc, indent=1) if args.json else render(args.endpoint, doc))
    return 0 if doc["verdict"] == "matches" else 1
