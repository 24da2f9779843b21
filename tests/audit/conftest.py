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


def audit_file(path: Path, preset: str | None = None, config: dict[str, Any] | None = None,
               layer_type: str | None = None) -> Audit:
    return run(read_path(path, Settings()), preset, config, layer_type)


def bytes_read() -> int:
    """Bytes this process has read so far through read(2) and its kin (`rchar` of /proc/self/io): how much of a file
    a reader took, whatever the machine's load (a wall-clock bound is not)."""
    io = Path("/proc/self/io")
    if not io.exists():
        pytest.skip("needs Linux's /proc/self/io")
    return next(int(line.split()[1]) for line in io.read_text().splitlines() if line.startswith("rchar:"))


def mistakes(result: Audit) -> set[str]:
    return {fact.mistake for fact in result.failing if fact.mistake}


def readyz_while_held(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, body: bytes) -> None:
    """POST `body` to /v1/audit with `module.name` (a step of the parse) held until /readyz has answered: /readyz
    answers (200) while the step runs in a worker thread; on the event loop nothing would answer, the hold would
    time out, and the audit's outcome says so."""
    import threading

    from tests.conftest import running_client

    started, release, outcome = threading.Event(), threading.Event(), {}
    real = getattr(module, name)

    def held(*args: Any, **kwargs: Any) -> Any:
        if not started.is_set():
            started.set()
            outcome["released"] = release.wait(20)  # False: nothing answered while the step held the loop
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, held)
    with running_client() as client:
        audit = threading.Thread(target=lambda: outcome.update(
            status=client.post("/v1/audit", content=body).status_code))
        audit.start()
        assert started.wait(20)
        ready = client.get("/readyz")
        release.set()
        audit.join(30)
    assert ready.status_code == 200
    assert outcome == {"released": True, "status": 200}
