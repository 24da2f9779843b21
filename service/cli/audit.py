"""`posenc audit`: a GGUF, ONNX, safetensors or config.json file checked for its position handling.

    posenc audit model.gguf                       # reference: the catalogue's matching preset
    posenc audit model.onnx --config config.json  # reference: that config.json (or a repository config)
    posenc audit model.gguf --preset llama-3.1-8b --json
    posenc audit gemma.gguf --preset gemma-3-4b-it --layer-type full_attention   # one layer type of several
    posenc audit model.onnx --remote http://127.0.0.1:8000   # sends only the extract, not the file
    posenc audit --preset llama-3.1-8b config.json model.safetensors   # several files: one report each

Exit status: 0 every fact as the reference says (or consistent, with no reference), 1 a fact is wrong or the
tables diverge, 2 bad usage or an unreadable file (the message says why): a CI job can gate on it. Several files
(what a pre-commit hook passes, .pre-commit-hooks.yaml) are audited each against the one reference, and the
status is the worst of theirs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from posenc.service.audit_limits import AuditBounds

# The handler imports the audit (numpy, the readers, the settings): `posenc audit --help` imports none of it.


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "audit", help="audit a GGUF, ONNX, safetensors or config.json file's position handling",
        description="posenc audit FILE... [--preset NAME | --config config.json] (exit status 0: correct, 1: a "
                    "fact is wrong, 2: bad usage or unreadable; several files: the worst of theirs)")
    p.add_argument("file", nargs="+", metavar="FILE",
                   help="the artifact: .gguf, .onnx, .safetensors or config.json (several: one report each)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--preset", help="reference preset (posenc's catalogue: GET /v1/presets)")
    group.add_argument("--config", help="reference config.json (Hugging Face, or a posenc repository config.json)")
    p.add_argument("--layer-type", metavar="NAME", help="judge this layer type alone (a model with RoPE per layer "
                                                         "type, e.g. full_attention; default: every one)")
    p.add_argument("--json", action="store_true", help="print the whole JSON report")
    p.add_argument("--png", metavar="PATH", help="also write the picture of the divergence here (one FILE only)")
    p.add_argument("--remote", metavar="URL", help="a running service audits the extract (the file stays here)")
    p.add_argument("--max-header-bytes", type=_bytes_bound, metavar="BYTES",
                   help="largest GGUF or safetensors header read (default: POSENC_AUDIT_MAX_HEADER_BYTES, 64 MiB)")
    p.add_argument("--max-onnx-bytes", type=_bytes_bound, metavar="BYTES",
                   help="largest ONNX or JSON file, read whole (default: POSENC_AUDIT_MAX_ONNX_BYTES, 64 MiB)")
    p.set_defaults(handler=run)


def _bytes_bound(value: str) -> int:
    """A --max-*-bytes value: a whole number of bytes, at least the settings' floor."""
    from posenc.service.audit_limits import FLOOR_BYTES

    if not (value.isascii() and value.isdigit()) or int(value) < FLOOR_BYTES:
        raise argparse.ArgumentTypeError(f"must be a whole number of bytes, at least {FLOOR_BYTES} (got {value!r})")
    return int(value)


def _remote(base: str, body: bytes, args: argparse.Namespace, config: str | None, fmt: str) -> bytes:
    from posenc.service.cli.remote import RemoteError, post  # urllib.request (ssl): with --remote only

    query = {k: v for k, v in {"preset": args.preset, "config": config, "layer_type": args.layer_type,
                               "format": fmt}.items() if v is not None}
    try:
        return post(base.rstrip("/") + "/v1/audit?" + urlencode(query), body, "application/json")
    except RemoteError as exc:
        raise SystemExit(f"posenc audit: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from posenc.service.audit.report import text

    if args.png and len(args.file) > 1:
        sys.stderr.write("posenc audit: --png takes one FILE\n")
        return 2
    settings = _bounds(args.max_header_bytes, args.max_onnx_bytes)
    if len(args.file) == 1:
        status, doc = _audit(args, args.file[0], settings)
        if doc is not None:
            print(json.dumps(doc, indent=1) if args.json else text(doc, args.file[0]))
        return status
    # several files: each audited and reported in turn (text: a blank line between; --json: one object, file name
    # -> report, null where the file could not be audited), the worst status
    statuses: list[int] = []
    docs: dict[str, dict[str, Any] | None] = {}
    for name in args.file:
        status, doc = _audit(args, name, settings)
        statuses.append(status)
        docs[name] = doc
        if doc is not None and not args.json:
            print(("\n" if len(statuses) > 1 else "") + text(doc, name), flush=True)
    if args.json:
        print(json.dumps(docs, indent=1))
    return max(statuses)


def _bounds(header: int | None, whole: int | None) -> AuditBounds:
    """The read bounds, the service's for uploads: the defaults, or the settings (validated, a bad value exits naming
    the variable) when a `POSENC_AUDIT_*` variable is set; a --max-*-bytes flag given replaces its bound."""
    from posenc.service.audit_limits import DefaultBounds, bounds_are_default

    if bounds_are_default():
        base: AuditBounds = DefaultBounds()
    else:
        from posenc.service.cli.settings_from_env import settings_or_exit

        base = settings_or_exit(access_log=False)
    if header is None and whole is None:
        return base
    return DefaultBounds(base.audit_max_header_bytes if header is None else header,
                         base.audit_max_onnx_bytes if whole is None else whole)


def _text(data: bytes, name: str) -> str:
    """--config's bytes as text; a refusal naming the file where they are not UTF-8."""
    from posenc.service.errors import BadRequest

    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"{name}: not UTF-8 text (byte {exc.start}); --config takes a config.json") from None


def _audit(args: argparse.Namespace, name: str, settings: AuditBounds) -> tuple[int, dict[str, Any] | None]:
    """One file's status (0 consistent, 1 wrong, 2 unusable: said on stderr) and report."""
    from posenc.models.errors import ParameterError
    from posenc.service.audit import extract
    from posenc.service.audit.report import picture
    from posenc.service.audit.run import parse_config, read_path
    from posenc.service.audit.run import run as run_audit
    from posenc.service.audit.stream import read_regular
    from posenc.service.errors import ServiceError

    try:
        config_text = _text(read_regular(Path(args.config), settings.audit_max_onnx_bytes), args.config) \
            if args.config else None
        found = read_path(Path(name), settings)
        if args.remote:
            # a config.json goes as it is (its warnings are the server's to find); any other file as its extract
            body = read_regular(Path(name), settings.audit_max_onnx_bytes) if found.source == "config.json" \
                else json.dumps(extract.dump(found)).encode()
            doc = json.loads(_remote(args.remote, body, args, config_text, "json"))
            if args.png:
                Path(args.png).write_bytes(_remote(args.remote, body, args, config_text, "png"))
        else:
            result = run_audit(found, args.preset, parse_config(config_text), args.layer_type)
            doc = result.document()
            if args.png:
                Path(args.png).write_bytes(picture(result, Path(name).name))
    except SystemExit as exc:
        sys.stderr.write(f"{exc.code}\n")
        return 2, None
    except ServiceError as exc:
        sys.stderr.write(f"posenc audit: {exc.message}\n")
        return 2, None
    except (ParameterError, OSError) as exc:
        sys.stderr.write(f"posenc audit: {exc}\n")
        return 2, None
    except MemoryError:  # within the bounds a file fits; a process limit set lower still exits as unreadable
        sys.stderr.write(f"posenc audit: {name}: not enough memory to audit it\n")
        return 2, None
    return (1 if doc["verdict"] == "wrong" else 0), doc
