"""`posenc audit` reads local files as the service reads uploads: regular files only (a device, a FIFO, a directory,
or a symbolic link to one, is refused without a read, and a FIFO without waiting for a writer), ONNX and JSON within
POSENC_AUDIT_MAX_ONNX_BYTES (`--max-onnx-bytes` raises it), each refusal one line and exit status 2. The command runs
in a process of its own, under a timeout: a FIFO must not block it, and a refusal must be no traceback."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from posenc.service.audit_limits import MAX_ONNX_BYTES
from posenc.service.testing import without_posenc
from tests.audit_files import SMALL_LLAMA3, caches_of, genai_onnx

ADDRESS_SPACE = 2 << 30  # the command's address space: a file read whole past the bound would not fit


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def _audit(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = subprocess.run([sys.executable, "-m", "posenc.service.cli", "audit", *map(str, args)], cwd=cwd,
                          env={**without_posenc(), **(env or {})}, capture_output=True, text=True, timeout=60,
                          preexec_fn=_limited)
    return done.returncode, done.stdout, done.stderr


def _refused(answer: tuple[int, str, str], said: str) -> None:
    status, _, err = answer
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("posenc audit: ") and said in err, err


@pytest.mark.parametrize("name", ["x.gguf", "config.json", "model.onnx"])
def test_a_link_to_dev_zero_is_refused_without_a_read(tmp_path: Path, name: str) -> None:
    (tmp_path / name).symlink_to("/dev/zero")
    _refused(_audit(name, cwd=tmp_path), f"{name} (-> /dev/zero) is a character device: posenc audit reads regular "
                                          "files only")


def test_dev_zero_a_directory_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    _refused(_audit("/dev/zero", cwd=tmp_path), "/dev/zero is a character device")
    _refused(_audit(".", cwd=tmp_path), ". is a directory")
    _refused(_audit("missing.onnx", cwd=tmp_path), "cannot read missing.onnx: No such file or directory")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "model.onnx")
    _refused(_audit("model.onnx", cwd=tmp_path), "model.onnx is a FIFO")


def test_a_config_that_is_a_device_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SMALL_LLAMA3))
    _refused(_audit("config.json", "--config", "/dev/zero", cwd=tmp_path), "/dev/zero is a character device")


def test_a_sparse_file_over_the_bound_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """2 GiB of holes: read whole it would not fit the command's address space (it took 4.2 GB)."""
    with (tmp_path / "model.onnx").open("wb") as handle:
        handle.truncate(2 << 30)
    _refused(_audit("model.onnx", cwd=tmp_path),
             f"model.onnx: 2147483648 bytes (2048.0 MiB), over the {MAX_ONNX_BYTES} bytes (64.0 MiB) an ONNX or JSON "
             "file is read within (POSENC_AUDIT_MAX_ONNX_BYTES; raise it with `posenc audit --max-onnx-bytes BYTES`)")


def test_the_bound_is_the_uploads_and_the_flag_raises_it(tmp_path: Path) -> None:
    """A regular ONNX file (and a link to it) is audited; over POSENC_AUDIT_MAX_ONNX_BYTES it is refused, and
    `--max-onnx-bytes` lets it through again."""
    cos, sin = caches_of(SMALL_LLAMA3, 2048)
    model = tmp_path / "model.onnx"
    model.write_bytes(genai_onnx(cos, sin))
    (tmp_path / "link.onnx").symlink_to(model)
    size = model.stat().st_size
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA3))
    for name in ("model.onnx", "link.onnx"):
        status, out, err = _audit(name, "--config", config, cwd=tmp_path)
        assert status == 0 and "position handling: CORRECT" in out, err
    lower = {"POSENC_AUDIT_MAX_ONNX_BYTES": str(size - 1)}
    _refused(_audit("model.onnx", cwd=tmp_path, env=lower), f"model.onnx: {size} bytes")
    status, _, err = _audit("model.onnx", "--config", config, "--max-onnx-bytes", str(size), cwd=tmp_path, env=lower)
    assert status == 0, err
    status, _, err = _audit("model.onnx", "--max-onnx-bytes", "12", cwd=tmp_path)
    assert status == 2 and "--max-onnx-bytes: must be a whole number of bytes, at least 1024 (got '12')" in err
