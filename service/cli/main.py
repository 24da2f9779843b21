"""The `posenc` console script.

`main` builds the parser of the one subcommand it runs (`posenc audit ...` imports the audit command's module
alone, and that module imports what its handler needs in the handler): a command starts without importing the
web framework, the table registry or the export options. `posenc --help` (no subcommand named) builds them all.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

# The subcommands, in the order `posenc --help` lists them (`build_parser` registers each).
COMMANDS = ("table", "check", "calibrate", "audit", "serve", "export")


def _serve(args: argparse.Namespace) -> int:
    """`posenc serve`: the exit status says how it stopped (see `posenc.service.serving.server.serve`)."""
    import os

    from posenc.service.cli.settings_from_env import settings_or_exit

    overrides = {k: v for k, v in {"host": args.host, "port": args.port, "workers": args.workers,
                                   "log_level": args.log_level}.items() if v is not None}
    settings = settings_or_exit(**overrides)
    # Workers re-read the environment: pass the CLI overrides down through it.
    for key, value in overrides.items():
        os.environ[f"POSENC_{key.upper()}"] = str(value)
    from posenc.service.serving.server import serve

    return serve(settings)


def _export(args: argparse.Namespace) -> int:
    """`posenc export`: torch is an export-time extra; say so plainly when it is missing."""
    try:
        from posenc.models.export import exporter
    except ImportError as exc:
        sys.stderr.write(f"posenc export needs the export extra (torch, onnx, onnxscript): {exc}\n"
                         "install it with: pip install 'posenc[export]'\n")
        return 2
    from posenc.models.errors import ParameterError

    try:
        from posenc.service.inference.runtime.calibration import measure_rule

        folders = exporter.run_export(args, measure_rule)
    except (ParameterError, exporter.ExportError, OSError, ValueError, KeyError) as exc:
        sys.stderr.write(f"posenc export: {exc}\n")
        return 2
    for folder in folders:
        print(folder)
    return 0


def _add_export_parser(commands: argparse._SubParsersAction) -> None:
    from posenc.models.export.arguments import add_export_arguments  # the rope_type registry (numpy): export only

    export = commands.add_parser(
        "export", help="export a RoPE-attention ONNX graph into a model repository (needs torch)",
        description="Regenerate the shipped repository: posenc export --defaults --repository onnx",
    )
    add_export_arguments(export)  # torch-free: importing the exporter is deferred to `_export`
    export.set_defaults(handler=_export)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser, or with `command` (one of COMMANDS) that one's alone: the same parser for that
    command, without importing the other commands' modules."""
    parser = argparse.ArgumentParser(prog="posenc", description="Positional-encoding tables and RoPE attention.")
    commands = parser.add_subparsers(dest="command", required=True)

    def wanted(name: str) -> bool:
        return command is None or command == name

    if wanted("table"):
        from posenc.service.cli import table as table_cli  # its own module: `posenc table` (tables without a server)

        table_cli.add_parser(commands)
    if wanted("check"):
        from posenc.service.cli import check as check_cli  # `posenc check`: your tensors against the golden table

        check_cli.add_parser(commands)
    if wanted("calibrate"):
        from posenc.service.cli import calibrate as calibrate_cli  # `posenc calibrate`: the CPU form's crossover

        calibrate_cli.add_parser(commands)
    if wanted("audit"):
        from posenc.service.cli import audit as audit_cli  # `posenc audit`: a GGUF/ONNX/safetensors file's facts

        audit_cli.add_parser(commands)
    if wanted("serve"):
        serve = commands.add_parser("serve", help="run the HTTP service (settings from POSENC_* variables)")
        serve.add_argument("--host", help="bind address (POSENC_HOST, default 127.0.0.1)")
        serve.add_argument("--port", type=int, help="port (POSENC_PORT, default 8000)")
        serve.add_argument("--workers", type=int, help="worker processes (POSENC_WORKERS, default 1)")
        serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="POSENC_LOG_LEVEL")
        serve.set_defaults(handler=_serve)
    if wanted("export"):
        _add_export_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # the first argument names the subcommand (the top-level parser has no options but --help)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    args = build_parser(command).parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
