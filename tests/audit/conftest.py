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


def mistakes(result: Audit) -> set[str]:
    return {fact.mistake for fact in result.failing if fact.mistake}
