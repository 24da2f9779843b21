"""`posenc check --url`: the diagnosis from a running server, and its refusals."""

from pathlib import Path

import pytest
from safetensors.numpy import save_file

from models.rope import make_rope_parameters, rope_cos_sin
from service.cli.main import main

ROPE = "/v1/rope?max_position=48&head_dim=16"


@pytest.fixture
def gptj_pairs(tmp_path: Path) -> Path:
    cos, sin, _ = rope_cos_sin(make_rope_parameters(head_dim=16), 48, layout="interleaved")
    path = tmp_path / "mine.safetensors"
    save_file({"cos": cos, "sin": sin}, str(path))
    return path


def test_against_a_running_server(server: str, gptj_pairs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", ROPE, "--file", str(gptj_pairs), "--url", server]) == 1
    assert "mismatch: layout" in capsys.readouterr().out
    assert main(["check", "/v1/rope?max_position=48&head_dim=15", "--file", str(gptj_pairs), "--url", server]) == 2
    assert "HTTP 422" in capsys.readouterr().err

