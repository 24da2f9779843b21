"""`posenc check`: in process and against a running server, the diagnosis printed and the exit status
(0 matches, 1 mismatch, 2 refused)."""

import json
from pathlib import Path

import numpy as np
import pytest

from posenc.models.sinusoidal import sinusoidal_table
from posenc.service.cli.main import main
from tests.conftest import CHECK_ROPE as ROPE


def test_mismatch_prints_the_cause_and_exits_1(gptj_pairs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", ROPE, "--file", str(gptj_pairs)]) == 1
    out = capsys.readouterr().out
    assert "mismatch: layout" in out and "GPT-J" in out and f"golden table: GET {ROPE}" in out


def test_match_exits_0_and_params_may_follow(gptj_pairs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "/v1/check/rope", "max_position=48", "head_dim=16", "layout=interleaved",
                 "--file", str(gptj_pairs), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == "matches" and doc["agreement"]["cos"]["max_abs"] == 0


def test_npy_with_tensor(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pe.npy"
    np.save(path, sinusoidal_table(16, 8, offset=1))
    assert main(["check", "/v1/sinusoidal?max_position=16&dim=8", "--file", str(path)]) == 1
    assert "offset_+1" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "words"), [
    (["/v1/rope?max_position=48&head_dim=15"], ["head_dim", "HTTP 422"]),
    (["/v1/nope"], ["no route"]),
    (["/v1/sinusoidal?max_position=48&dim=16"], ["cos", "HTTP 400"]),
])
def test_refused_exits_2(gptj_pairs: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                         words: list[str]) -> None:
    assert main(["check", *args, "--file", str(gptj_pairs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc check:")
    for word in words:
        assert word in err


def test_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", ROPE, "--file", str(tmp_path / "absent.safetensors")]) == 2
    assert "cannot read --file" in capsys.readouterr().err
