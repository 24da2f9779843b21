"""`posenc` starts without the web framework: a subcommand builds its own parser alone, and `posenc audit --help`
imports no fastapi, starlette, uvicorn or pydantic-settings; an audit of a GGUF file imports the gguf package's
constants alone, no settings (unless a `POSENC_AUDIT_*` bound is set), no asyncio and no numpy.ma (what
`python -X importtime` lists, in a fresh interpreter). The parser a command builds alone is the one `posenc --help`
builds with every command."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posenc.service.cli.main import COMMANDS, build_parser, main
from tests.conftest import TESTS

WEB = ("fastapi", "starlette", "uvicorn", "pydantic_settings")


def imported_modules(code: str, **environ: str) -> list[str]:
    """The modules a fresh interpreter imports running `code` (the names `-X importtime` prints), in this
    environment without its `POSENC_*` variables, plus `environ`."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("POSENC_")} | environ
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], cwd=TESTS.parent,
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    names = [line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2]
    assert "posenc.service.cli.main" in names, result.stderr[-2000:]
    return names


def test_audit_help_imports_no_web_framework() -> None:
    names = imported_modules("from posenc.service.cli.main import main\n"
                             "try:\n    main(['audit', '--help'])\n"
                             "except SystemExit as exc:\n    assert exc.code == 0, exc.code\n")
    assert "posenc.service.cli.audit" in names
    web = [name for name in names if name.split(".")[0] in WEB]
    assert web == [], f"posenc audit --help imported {web}"


def test_an_audit_of_a_small_gguf_imports_no_web_framework(tmp_path: Path) -> None:
    from tests.audit_files import llama_gguf_meta, write_gguf

    path = write_gguf(tmp_path / "small.gguf", "llama", llama_gguf_meta(8192, 500000.0, kv=8))
    names = imported_modules("from posenc.service.cli.main import main\n"
                             f"assert main(['audit', {str(path)!r}]) == 0\n")
    assert "posenc.service.audit.run" in names
    # the bounds are the defaults without the settings; the file is read without an event loop; numpy.ma (45 ms,
    # imported by np.unique) is never needed, where numpy itself does not import it (numpy 1.x does)
    numpy_alone = imported_modules("import numpy\nfrom posenc.service.cli.main import main\n")
    heavy = [name for name in names if name.split(".")[0] in (*WEB, "pydantic", "asyncio")
             or (name == "numpy.ma" and name not in numpy_alone)]
    assert heavy == [], f"posenc audit FILE imported {heavy}"
    # the gguf package's constants alone, loaded from their file: its __init__ brings its writer, vocabulary and
    # metadata (yaml)
    heavy = [name for name in names if name.split(".")[0] in ("gguf", "yaml")]
    assert heavy == [], f"posenc audit FILE imported {heavy}"


def test_a_bound_set_in_the_environment_is_the_settings_one(tmp_path: Path) -> None:
    """With POSENC_AUDIT_MAX_HEADER_BYTES set, the settings are built and hold: a header over it is refused, a
    value under the floor exits naming the variable."""
    from tests.audit_files import llama_gguf_meta, write_gguf

    meta = {**llama_gguf_meta(8192, 500000.0, kv=8), "general.description": "x" * 4096}  # a 4 KiB header
    path = write_gguf(tmp_path / "small.gguf", "llama", meta)
    run = f"from posenc.service.cli.main import main\nraise SystemExit(main(['audit', {str(path)!r}]))\n"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("POSENC_")}
    for value, status, said in (("2048", 2, "header"), ("12", 2, "POSENC_AUDIT_MAX_HEADER_BYTES"), ("", 0, "")):
        extra = {"posenc_audit_max_header_bytes": value} if value else {}
        result = subprocess.run([sys.executable, "-c", run], cwd=TESTS.parent, capture_output=True, text=True,
                                timeout=120, env=env | extra)
        assert result.returncode == status, (value, result.stdout, result.stderr)
        assert said in result.stderr


def test_the_console_script_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS)
    subcommands = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subcommands) == 1 and tuple(subcommands[0].choices) == COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_built_alone_has_the_help_of_the_whole_parser(command: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    helps = []
    for parser in (build_parser(command), build_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        helps.append(capsys.readouterr().out)
    assert helps[0] == helps[1] and f"usage: posenc {command}" in helps[0]
