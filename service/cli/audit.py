"""`posenc audit`: a GGUF, ONNX, safetensors or config.json file checked for its position handling.

    posenc audit model.gguf                       # reference: the catalogue's matching preset
    posenc audit model.onnx --config config.json  # reference: that config.json (or a repository config)
    posenc audit model.gguf --preset llama-3.1-8b --json
    posenc audit model.onnx --remote http://127.0.0.1:8000   # sends only the extract, not the file

Exit status: 0 every fact as the reference says (or consistent, with no reference), 1 a fact is wrong or the
tables diverge, 2 bad usage or an unreadable file (the message says why): a CI job can gate on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

# The handler imports the audit (numpy, the readers, the settings): `posenc audit --help` imports none of it.


def add_parser(commands: Any) -> None:
    p = commands.add_parser(
        "audit", help="audit a GGUF, ONNX, safetensors or config.json file's position handling",
        description="posenc audit FILE [--preset NAME | --config config.json] (exit status 0: correct, 1: a fact "
                    "is wrong, 2: bad usage or unreadable)")
    p.add_argument("file", help="the artifact: .gguf, .onnx, .safetensors or config.json")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--preset", help="reference preset (posenc's catalogue: GET /v1/presets)")
    group.add_argument("--config", help="reference config.json (Hugging Face, or a posenc repository config.json)")
    p.add_argument("--json", action="store_true", help="print the whole JSON report")
    p.add_argument("--png", metavar="PATH", help="also write the picture of the divergence here")
    p.add_argument("--remote", metavar="URL", help="a running service audits the extract (the file stays here)")
    p.set_defaults(handler=run)


def _remote(base: str, body: bytes, preset: str | None, config: str | None, fmt: str) -> bytes:
    from posenc.service.cli.remote import RemoteError, post  # urllib.request (ssl): with --remote only

    query = {k: v for k, v in {"preset": preset, "config": config, "format": fmt}.items() if v is not None}
    try:
        return post(base.rstrip("/") + "/v1/audit?" + urlencode(query), body, "application/json")
    except RemoteError as exc:
        raise SystemExit(f"posenc audit: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from posenc.models.errors import ParameterError
    from posenc.service.audit import extract
    from posenc.service.audit.report import picture, text
    from posenc.service.audit.run import parse_config, read_path
    from posenc.service.audit.run import run as run_audit
    from posenc.service.cli.settings_from_env import settings_or_exit
    from posenc.service.errors import ServiceError

    settings = settings_or_exit(access_log=False)
    try:
        config_text = Path(args.config).read_text() if args.config else None
        found = read_path(Path(args.file), settings)
        if args.remote:
            # a config.json goes as it is (its warnings are the server's to find); any other file as its extract
            body = Path(args.file).read_bytes() if found.source == "config.json" \
                else json.dumps(extract.dump(found)).encode()
            doc = json.loads(_remote(args.remote, body, args.preset, config_text, "json"))
            if args.png:
                Path(args.png).write_bytes(_remote(args.remote, body, args.preset, config_text, "png"))
        else:
            result = run_audit(found, args.preset, parse_config(config_text))
            doc = result.document()
            if args.png:
                Path(args.png).write_bytes(picture(result, Path(args.file).name))
    except SystemExit as exc:
        sys.stderr.write(f"{exc.code}\n")
        return 2
    except ServiceError as exc:
        sys.stderr.write(f"posenc audit: {exc.message}\n")
        return 2
    except (ParameterError, OSError) as exc:
        sys.stderr.write(f"posenc audit: {exc}\n")
        return 2
    print(json.dumps(doc, indent=1) if args.json else text(doc, args.file))
    return 1 if doc["verdict"] == "wrong" else 0
