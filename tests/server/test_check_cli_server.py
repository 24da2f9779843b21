"""`posenc check --url`: the diagnosis from a running server, and its refusals."""

from pathlib import Path

import pytest

from posenc.service.cli.main import main
from tests.conftest import CHECK_ROPE as ROPE


def test_against_a_running_server(server: str, gptj_pairs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", ROPE, "--file", str(gptj_pairs), "--url", server]) == 1
    assert "mismatch: layout" in capsys.readouterr().out
    assert main(["check", "/v1/rope?max_position=48&head_dim=15", "--file", str(gptj_pairs), "--url", server]) == 2
    assert "HTTP 422" in capsys.readouterr().err

