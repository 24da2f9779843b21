"""Behaviours of the audit that each hold one line in place: a test per mistake that once got past the suite (each
fails with its mistake planted back; issue 56)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save_file

from posenc.models.audit.frequencies import golden
from posenc.models.presets import find_preset
from posenc.models.rope_config import rope_parameters_from_config
from posenc.models.rope_frequencies import default_inv_freq
from posenc.service.audit import extract
from posenc.service.audit.run import read_path
from posenc.service.settings import Settings
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import SMALL_LLAMA3, caches_of, genai_onnx, llama_gguf_meta, write_gguf
from tests.conftest import running_client


def test_gguf_scale_linear_is_the_factor_as_llama_cpp_reads_it(tmp_path: Path) -> None:
    """`{arch}.rope.scale_linear`, the old key of `rope.scaling.factor`, holds the factor (4.0 for a 4x linear
    model), not its inverse."""
    meta = {**llama_gguf_meta(16384, 10000.0, kv=32), "rope.scaling.type": "linear", "rope.scale_linear": 4.0}
    found = read_path(write_gguf(tmp_path / "old_key.gguf", "llama", meta), Settings())
    assert found.scaling == {"rope_type": "linear", "factor": 4.0}


def _chunked(body: bytes, size: int = 256) -> Iterator[bytes]:
    """A generator body: httpx sends it chunked, with no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start:start + size]


@pytest.mark.parametrize("kind", ["json", "onnx"])
def test_a_chunked_upload_over_the_onnx_bound_is_413(kind: str) -> None:
    """A body read whole (ONNX, JSON) without a Content-Length is counted as it streams in, not only declared."""
    if kind == "json":
        body = json.dumps({**SMALL_LLAMA3, "_name_or_path": "x" * 8192}).encode()
    else:
        cos, sin = caches_of(SMALL_LLAMA3, 2048)
        body = genai_onnx(cos, sin)
    limit = len(body) // 2
    with running_client(audit_max_onnx_bytes=limit) as small:
        answer = small.post("/v1/audit", content=_chunked(body))
    assert "content-length" not in {k.lower() for k in answer.request.headers}
    assert answer.status_code == 413, answer.text
    assert "POSENC_AUDIT_MAX_ONNX_BYTES" in answer.json()["error"]


@pytest.mark.parametrize("field", ["num_heads", "head_dim"])
def test_an_extract_with_zero_heads_or_head_dim_is_400(client: TestClient, tmp_path: Path, field: str) -> None:
    """The extract's counts are at least 1, as a file's are: 0 is refused with the field named."""
    path = write_gguf(tmp_path / "model.gguf", "llama", llama_gguf_meta(16384, 1e6, kv=32))
    document: dict[str, Any] = extract.dump(read_path(path, Settings()))
    assert client.post("/v1/audit", content=json.dumps(document)).status_code == 200
    document[field] = 0
    answer = client.post("/v1/audit", content=json.dumps(document))
    assert answer.status_code == 400, answer.text
    assert f"extract: {field}" in answer.json()["error"]


def test_inv_freq_of_the_short_set_at_the_long_context_is_short_long_swapped(tmp_path: Path) -> None:
    """phi-3.5's context (131072) is past its switch length (4096): the reference is the long factor set, and a
    checkpoint whose inv_freq is the short set has the two exchanged."""
    config = find_preset("phi-3.5-mini-instruct").config
    params, _ = rope_parameters_from_config(config)
    assert params.rope_type == "longrope" and params.max_position_embeddings == 131072
    short = golden(params, params.original_max_position_embeddings).inv_freq
    path = tmp_path / "phi.safetensors"
    save_file({"model.embed_tokens.weight": np.zeros((16, 8), np.float32),
               "model.layers.0.self_attn.rotary_emb.inv_freq": short}, str(path))
    result = audit_file(path, preset="phi-3.5-mini-instruct")
    assert "longrope_short_long_swapped" in mistakes(result), result.document()["facts"]


def test_float32_caches_of_another_base_over_4096_rows_are_named_theta(tmp_path: Path) -> None:
    """float32 caches of base 500000 against a base-10000 model, their angles computed in float32 as the
    onnxruntime-genai builder computes them (position x inv_freq): by row 4095 an angle is off by ulps of the
    angle (about 1e-4), far over the dtype's eps, which the match allows for; the mistake is named `theta`."""
    reference = {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8, "num_key_value_heads": 8,
                 "max_position_embeddings": 4096, "rope_theta": 10000.0}
    angles = np.arange(4096, dtype=np.float32)[:, None] * default_inv_freq(500000.0, 64).astype(np.float32)
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    path = tmp_path / "model.onnx"
    path.write_bytes(genai_onnx(cos, sin, heads=8, kv_heads=8))
    result = audit_file(path, config=reference)
    assert mistakes(result) == {"theta"}, result.document()["facts"]
