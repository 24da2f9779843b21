"""House rules of the inference feature: service/ never imports torch; export says so when torch is missing."""

from __future__ import annotations

import sys

import pytest

from posenc.service.cli.main import main as posenc_main
from tests.conftest import assert_runs_in_fresh_python


def test_service_runs_without_importing_torch() -> None:
    code = ("import sys\n"
            "from fastapi.testclient import TestClient\n"
            "from posenc.service.http.app import create_app\n"
            "from posenc.service.cli.main import build_parser\n"
            "with TestClient(create_app()) as c:\n"
            "    assert c.get('/v2/health/ready').status_code == 200\n"
            "build_parser().parse_args(['export', '--defaults'])\n"
            "assert 'torch' not in sys.modules, 'service imported torch'\n")
    assert_runs_in_fresh_python(code)


def test_export_without_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch → ImportError
    for name in ("posenc.models.export.exporter", "posenc.models.export.rope_attention"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delattr("posenc.models.export.exporter", raising=False)
    assert posenc_main(["export", "--defaults", "--repository", "/nonexistent"]) == 2
    assert "posenc[export]" in capsys.readouterr().err
