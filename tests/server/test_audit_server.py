"""POST /v1/audit on a real server: a GGUF upload far larger than any body limit is answered from its first
megabytes (the header, then the position tensors; the rest is never waited for), the server stays well; and
`posenc audit --remote` against it."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest.importorskip("gguf", reason="the audit extra: pip install 'posenc[audit]'")

from posenc.service.cli.main import main
from tests.audit_files import llama3_rope_factors, llama_gguf_meta, write_gguf


def test_a_large_gguf_upload_streams_through(server: str, tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "big.gguf", "llama", llama_gguf_meta(131072, 500000.0),
                      {"rope_freqs.weight": llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)},
                      sparse_bytes=1 << 30)  # 1 GiB, over POSENC_MAX_REQUEST_BYTES and the audit's ONNX bound
    url = urlsplit(server)
    # a server that waited for the rest of the declared body would never answer: the socket's timeout ends the
    # test then (a TimeoutError), whatever the machine's load
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    connection.putrequest("POST", "/v1/audit")
    connection.putheader("Content-Length", str(path.stat().st_size))
    connection.endheaders()
    sent = 0
    with path.open("rb") as handle:  # only the first 8 MiB of the declared GiB: the answer must not wait for more
        while sent < 8 << 20:
            chunk = handle.read(1 << 20)
            connection.send(chunk)
            sent += len(chunk)
    response = connection.getresponse()
    doc = json.loads(response.read())
    connection.close()
    assert response.status == 200 and doc["verdict"] == "consistent", doc  # the reference is a guess by shape
    assert sent == 8 << 20 < path.stat().st_size  # answered from what was sent: 8 MiB of the GiB declared
    again = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    again.request("GET", "/healthz")
    assert again.getresponse().status == 200
    again.close()


def test_cli_remote(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_gguf(tmp_path / "bad.gguf", "llama", llama_gguf_meta(131072, 500000.0))
    assert main(["audit", str(path), "--preset", "llama-3.1-8b", "--remote", server]) == 1
    assert "frequency_factors_missing" in capsys.readouterr().out
