"""POST /v1/audit (streamed GGUF and safetensors bodies, bounded ONNX bodies, the extract) and `posenc audit`
(text, JSON, picture, the exit status, --remote sending only the extract)."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from posenc.service.audit import extract
from posenc.service.audit.run import read_path, read_upload
from posenc.service.cli.main import main
from posenc.service.settings import Settings
from tests.audit_files import SMALL_LLAMA3, caches_of, genai_onnx, llama3_rope_factors, llama_gguf_meta, write_gguf
from tests.conftest import running_client

FREQS = {"rope_freqs.weight": llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)}


@pytest.fixture
def good_gguf(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "good.gguf", "llama", llama_gguf_meta(131072, 500000.0), FREQS, sparse_bytes=4 << 20)


@pytest.fixture
def bad_gguf(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "bad.gguf", "llama", llama_gguf_meta(131072, 500000.0))


async def _chunks(path: Path, read: list[int], size: int = 1 << 20) -> AsyncIterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(size):
            read[0] += len(chunk)
            yield chunk


def test_an_upload_streams_and_stops_after_the_tensors_it_needs(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "big.gguf", "llama", llama_gguf_meta(131072, 500000.0), FREQS, sparse_bytes=1 << 30)
    read = [0]
    tracemalloc.start()
    found = asyncio.run(read_upload(_chunks(path, read), path.stat().st_size, Settings()))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert found.freq_factors is not None and found.freq_factors.shape == (64,)
    assert read[0] <= 2 << 20 < path.stat().st_size  # the 1 GiB tensor after rope_freqs was never read
    assert peak < 8 << 20


def test_route_streams_a_gguf(client: TestClient, good_gguf: Path) -> None:
    response = client.post("/v1/audit", content=good_gguf.read_bytes())
    assert response.status_code == 200, response.text
    doc = response.json()
    assert doc["verdict"] == "consistent" and doc["reference"]["label"].startswith("preset llama-3.1-8b")  # a guess


def test_route_names_the_bug_and_draws_it(client: TestClient, bad_gguf: Path) -> None:
    doc = client.post("/v1/audit?preset=llama-3.1-8b", content=bad_gguf.read_bytes()).json()
    assert doc["verdict"] == "wrong" and doc["mistakes"] == ["frequency_factors_missing"]
    assert doc["tables"]["first_divergent_position"] is not None
    png = client.post("/v1/audit?format=png&preset=llama-3.1-8b", content=bad_gguf.read_bytes())
    assert png.status_code == 200 and png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"


def test_route_refusals(client: TestClient, bad_gguf: Path) -> None:
    assert client.post("/v1/audit?format=npy", content=b"x").status_code == 422
    assert client.post("/v1/audit", content=b"").status_code == 400
    cut = client.post("/v1/audit", content=bad_gguf.read_bytes()[:60])
    assert cut.status_code == 400 and "truncated" in cut.json()["error"]
    unknown = client.post("/v1/audit?preset=no-such-model", content=bad_gguf.read_bytes())
    assert unknown.status_code == 400 and "unknown preset" in unknown.json()["error"]


def test_onnx_uploads_are_bounded_by_the_setting(tmp_path: Path) -> None:
    cos, sin = caches_of(SMALL_LLAMA3, 2048)
    body = genai_onnx(cos, sin)
    with running_client(audit_max_onnx_bytes=len(body) - 1) as small:
        refused = small.post("/v1/audit", content=body)
        assert refused.status_code == 413 and "--remote" in refused.json()["error"]
    with running_client() as client:
        answer = client.post("/v1/audit", params={"config": json.dumps(SMALL_LLAMA3)}, content=body)
        assert answer.json()["verdict"] == "correct", answer.json()


def test_an_onnx_upload_without_a_length_is_bounded_as_it_arrives() -> None:
    """Sent in chunks without Content-Length, the body's size is known only as it arrives: one byte over
    POSENC_AUDIT_MAX_ONNX_BYTES is a 413, exactly the bound is audited."""
    cos, sin = caches_of(SMALL_LLAMA3, 2048)
    body = genai_onnx(cos, sin)

    def chunks() -> Iterator[bytes]:
        yield from (body[i:i + 4096] for i in range(0, len(body), 4096))

    with running_client(audit_max_onnx_bytes=len(body) - 1) as small:
        refused = small.post("/v1/audit", content=chunks())
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"].startswith(f"a onnx upload over {len(body) - 1} bytes")
    with running_client(audit_max_onnx_bytes=len(body)) as exact:
        answer = exact.post("/v1/audit", params={"config": json.dumps(SMALL_LLAMA3)}, content=chunks())
    assert answer.status_code == 200 and answer.json()["verdict"] == "correct", answer.text


def test_the_extract_round_trips(client: TestClient, tmp_path: Path) -> None:
    cos, sin = caches_of(SMALL_LLAMA3, 1024)  # shorter than the 2048 context
    path = tmp_path / "model.onnx"
    path.write_bytes(genai_onnx(cos, sin))
    body = json.dumps(extract.dump(read_path(path, Settings())))
    doc = client.post("/v1/audit", params={"config": json.dumps(SMALL_LLAMA3)}, content=body).json()
    assert "cache_shorter_than_context" in doc["mistakes"]


def test_cli_text_exit_status_and_picture(good_gguf: Path, bad_gguf: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(good_gguf)]) == 0
    assert "position handling: CONSISTENT" in capsys.readouterr().out  # a guess by shape: no verdict on a model
    picture = tmp_path / "audit.png"
    assert main(["audit", str(bad_gguf), "--preset", "llama-3.1-8b", "--png", str(picture)]) == 1
    out = capsys.readouterr().out
    assert "MISSING" in out and "frequency_factors_missing" in out and "wrong from position" in out
    assert picture.read_bytes()[:4] == b"\x89PNG"
    assert main(["audit", str(bad_gguf), "--preset", "llama-3.1-8b", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["mistakes"] == ["frequency_factors_missing"]
    assert main(["audit", str(tmp_path / "missing.gguf")]) == 2


def test_cli_remote_sends_only_the_extract(bad_gguf: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    sent: list[bytes] = []

    class Answer:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def read(self) -> bytes:
            return self.data

        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *args: Any) -> None:
            return None

    with running_client() as client:
        def urlopen(request: Any, timeout: float) -> Answer:
            sent.append(request.data)
            path = request.full_url.split("://", 1)[1].split("/", 1)[1]
            return Answer(client.post("/" + path, content=request.data).content)

        monkeypatch.setattr("urllib.request.urlopen", urlopen)
        assert main(["audit", str(bad_gguf), "--preset", "llama-3.1-8b", "--remote", "http://posenc.test"]) == 1
    assert "frequency_factors_missing" in capsys.readouterr().out
    assert len(sent) == 1 and json.loads(sent[0])[extract.MARK] == 1 and len(sent[0]) < 4096


def test_cli_remote_sends_a_config_json_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    legacy = {**SMALL_LLAMA3, "rope_scaling": {("type" if k == "rope_type" else k): v
                                               for k, v in SMALL_LLAMA3["rope_scaling"].items()}}  # type: ignore[union-attr]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(legacy))
    sent: list[bytes] = []
    with running_client() as client:
        def urlopen(request: Any, timeout: float) -> Any:
            sent.append(request.data)
            answer = client.post("/" + request.full_url.split("/", 3)[3], content=request.data)

            class Answer:
                def read(self) -> bytes:
                    return answer.content

                def __enter__(self) -> Any:
                    return self

                def __exit__(self, *args: Any) -> None:
                    return None

            return Answer()

        monkeypatch.setattr("urllib.request.urlopen", urlopen)
        assert main(["audit", str(path), "--remote", "http://posenc.test"]) == 0
    assert sent == [path.read_bytes()]
    assert "rope_scaling.type" in capsys.readouterr().out  # the server found the legacy key's warning


def test_the_route_names_what_the_command_names(client: TestClient, tmp_path: Path) -> None:
    """Each planted bug, audited by POST /v1/audit (the bytes streamed in) and in process: the same report."""
    import numpy as np

    from posenc.models.presets import find_preset
    from tests.audit.conftest import audit_file

    rope = find_preset("phi-3.5-mini-instruct").config["rope_scaling"]
    long, short = np.asarray(rope["long_factor"], np.float32), np.asarray(rope["short_factor"], np.float32)
    phi = {"context_length": 131072, "embedding_length": 3072, "attention.head_count": 32, "rope.freq_base": 10000.0,
           "rope.scaling.original_context_length": 4096, "rope.scaling.attn_factor": 1.1902380714238083}
    qwen_vl = {**llama_gguf_meta(32768, 1e6, hidden=3584, heads=28, kv=4), "rope.dimension_sections": [24, 20, 20, 0]}
    files = {
        "codellama": (write_gguf(tmp_path / "a.gguf", "llama", llama_gguf_meta(16384, 10000.0, kv=32)), "codellama-7b"),
        "longrope": (write_gguf(tmp_path / "b.gguf", "phi3", phi, {"rope_factors_long.weight": short,
                                                                   "rope_factors_short.weight": long}),
                     "phi-3.5-mini-instruct"),
        "mrope": (write_gguf(tmp_path / "c.gguf", "qwen2vl", qwen_vl), "qwen2-vl-7b-instruct"),
        "yarn": (write_gguf(tmp_path / "d.gguf", "qwen2", llama_gguf_meta(32768, 1e6, hidden=3584, heads=28, kv=4)),
                 "qwen2.5-7b-instruct-yarn"),
    }
    named = {}
    for name, (path, preset) in files.items():
        doc = client.post("/v1/audit", params={"preset": preset} if preset else {}, content=path.read_bytes()).json()
        expected = audit_file(path, preset=preset).document()
        assert doc == expected, name
        named[name] = doc["mistakes"]
    assert named == {"codellama": ["wrong_freq_base"], "longrope": ["longrope_short_long_swapped"],
                     "mrope": ["mrope_sections_wrong"], "yarn": ["scaling_missing"]}
