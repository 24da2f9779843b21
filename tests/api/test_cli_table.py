"""`posenc table`: the file holds exactly what the HTTP API answers; errors exit non-zero with the message."""

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load_file

from posenc.service.cli.main import main
from tests.conftest import running_client

PARAMS = ["max_position=8", "dim=16", "variant=fairseq"]
QUERY = "max_position=8&dim=16&variant=fairseq"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with running_client() as c:
        yield c


def test_safetensors_file_equals_http_response(tmp_path: Path, client: TestClient) -> None:
    out = tmp_path / "pe.safetensors"
    assert main(["table", "/v1/sinusoidal", *PARAMS, "--output", str(out)]) == 0
    http = client.get(f"/v1/sinusoidal?{QUERY}&format=safetensors")
    assert out.read_bytes() == http.content
    pe = load_file(str(out))["pe"]
    assert pe.shape == (8, 16) and pe.dtype == np.float32
    assert not pe[1].any()  # fairseq: the padding row is zero


def test_npy_inferred_from_suffix(tmp_path: Path, client: TestClient) -> None:
    out = tmp_path / "pe.npy"
    assert main(["table", "sinusoidal", *PARAMS, "dtype=float64", "-o", str(out)]) == 0
    http = client.get(f"/v1/sinusoidal?{QUERY}&dtype=float64&format=npy")
    assert out.read_bytes() == http.content
    assert np.load(out).dtype == np.float64


def test_explicit_format_and_tensor_and_query_in_path(tmp_path: Path, client: TestClient) -> None:
    out = tmp_path / "pe.data"
    assert main(["table", f"/v1/sinusoidal?{QUERY}", "--format", "npy", "--tensor", "pe", "-o", str(out)]) == 0
    assert out.read_bytes() == client.get(f"/v1/sinusoidal?{QUERY}&format=npy").content


def test_bad_parameter_exits_nonzero_with_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "pe.npy"
    assert main(["table", "/v1/sinusoidal", "max_position=0", "dim=16", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "max_position" in err and "422" in err
    assert not out.exists()


def test_bfloat16_npy_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "/v1/sinusoidal", *PARAMS, "dtype=bfloat16", "-o", str(tmp_path / "x.npy")]) == 1
    assert "bfloat16" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [(["/healthz"], "not a v1 table endpoint"), (["/v1/sinusoidal", "dim"], "NAME=VALUE"),
     (["/v1/sinusoidal", "format=npy"], "--format"), (["/v1/nope", "a=1"], "no route")],
)
def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(["table", *argv, "-o", str(tmp_path / "t.safetensors")]) != 0
    assert needle in capsys.readouterr().err


def test_bad_setting_names_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("POSENC_MAX_TABLE_BYTES", "0")
    with pytest.raises(SystemExit) as exc:
        main(["table", "/v1/sinusoidal", *PARAMS, "-o", str(tmp_path / "t.npy")])
    assert exc.value.code == 2
    assert "POSENC_MAX_TABLE_BYTES" in capsys.readouterr().err


def test_size_limit_applies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("POSENC_MAX_TABLE_BYTES", "100")
    assert main(["table", "/v1/sinusoidal", *PARAMS, "-o", str(tmp_path / "t.npy")]) == 1
    assert "413" in capsys.readouterr().err


def test_stdout_output(capsysbinary: pytest.CaptureFixture[bytes], client: TestClient) -> None:
    assert main(["table", "/v1/sinusoidal", *PARAMS, "--format", "raw", "-o", "-"]) == 0
    assert capsysbinary.readouterr().out == client.get(f"/v1/sinusoidal?{QUERY}&format=raw").content


def test_post_endpoint_with_body(tmp_path: Path, client: TestClient) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"rope_theta": 10000, "head_dim": 8, "max_position_embeddings": 16, '
                      '"hidden_size": 64, "num_attention_heads": 8}')
    out = tmp_path / "rope.safetensors"
    assert main(["table", "/v1/rope/from-config", "--body", str(config), "-o", str(out)]) == 0
    http = client.post("/v1/rope/from-config", content=config.read_bytes(),
                       headers={"Content-Type": "application/json"})
    assert out.read_bytes() == http.content
    assert set(load_file(str(out))) == {"cos", "sin", "inv_freq"}


def test_every_get_table_route_works(tmp_path: Path, client: TestClient) -> None:
    """A multi-tensor GET endpoint through the same routes: the file equals the HTTP answer."""
    out = tmp_path / "cos.npy"
    assert main(["table", "/v1/rope", "max_position=16", "head_dim=8", "--tensor", "cos", "-o", str(out)]) == 0
    assert out.read_bytes() == client.get("/v1/rope?max_position=16&head_dim=8&format=npy&tensor=cos").content


def test_missing_body_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["table", "/v1/rope/from-config", "--body", str(tmp_path / "nope.json"),
                 "-o", str(tmp_path / "r.safetensors")]) == 2
    assert "cannot read --body" in capsys.readouterr().err
