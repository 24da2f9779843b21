"""Audits of GGUF, ONNX, safetensors and config.json files written by the tests (tests/audit_files.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from posenc.models.audit.rope_audit import Audit
from posenc.service.audit.run import read_path, run
from posenc.service.settings import Settings

pytest.importorskip("gguf", reason="the audit extra (gguf, onnx): pip install 'posenc[audit]'")
pytest.importorskip("onnx", reason="the audit extra (gguf, onnx): pip install 'posenc[audit]'")


def audit_file(path: Path, preset: str | None = None, config: dict[str, Any] | None = None) -> Audit:
    return run(read_path(path, Settings()), preset, config)


def bytes_read() -> int:
    """Bytes this process has read so far through read(2) and its kin (`rchar` of /proc/self/io): how much of a file
    a reader took, whatever the machine's load (a wall-clock bound is not)."""
    io = Path("/proc/self/io")
    if not io.exists():
        pytest.skip("needs Linux's /proc/self/io")
    return next(int(line.split()[1]) for line in io.read_text().splitlines() if line.startswith("rchar:"))


def mistakes(result: Audit) -> set[str]:
    return {fact.mistake for fact in result.failing if fact.mistake}
