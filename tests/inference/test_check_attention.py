"""`POST /v2/models/{name}/check`: the numpy reference equals the ONNX model, and an attention port with one
known mistake (written here independently, from the service's cos/sin tables) is diagnosed as that mistake."""

import json
import math
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load

from posenc.models.diagnosis.attention import AttentionSpec, attention, attention_tolerance
from posenc.models.export.shipped_models import SHIPPED_MODELS
from posenc.service.testing import kserve_request
from tests.conftest import running_client
from tests.onnx_models import REPOSITORY, SHIPPED, geometry, random_inputs, run, session

ROPE_QUERY = {"rope_attention": "head_dim=64",
              "llama3_1_attention": "head_dim=128&rope_theta=500000&rope_type=llama3&factor=8"
                                    "&original_max_position_embeddings=8192&low_freq_factor=1&high_freq_factor=4"}
# the public models' ports take their tables from the model's config.json (POST /v1/rope/from-config)
HF_CONFIGS = {model.name: dict(model.config) for model in SHIPPED_MODELS}


def config(name: str) -> dict[str, Any]:
    return dict(json.loads((REPOSITORY / name / "config.json").read_text()))


@pytest.mark.parametrize("name", SHIPPED)
def test_numpy_reference_equals_the_onnx_model(name: str) -> None:
    hq, hkv, d = geometry(name)
    switch = config(name)["rope"].get("switch_position")
    # longrope: the first row ends just below its switch, the second just past it (rows start 3 apart)
    inputs = random_inputs(hq, hkv, d, 2, 40, start=50 if switch is None else switch - 41)
    onnx_out = run(session(REPOSITORY / name / "model.onnx"), inputs)
    spec = AttentionSpec.from_config(config(name))
    assert spec is not None
    ours = attention(spec, inputs["query"], inputs["key"], inputs["value"], inputs["position_ids"])
    assert np.all(np.abs(ours - onnx_out) <= attention_tolerance(onnx_out))
    # the contract is tight enough to see a mistake
    masked = attention(spec, inputs["query"], inputs["key"], inputs["value"], inputs["position_ids"], causal=False)
    assert not np.all(np.abs(masked - onnx_out) <= attention_tolerance(onnx_out))


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def port(client: TestClient, name: str, inputs: dict[str, np.ndarray], *, causal: bool = True,
         scale: float | None = None, tile: bool = False, rope_v: bool = False, given: bool = True) -> np.ndarray:
    """A straightforward attention port: q·cos + rotate_half(q)·sin with the service's own tables."""
    q, k, v, pos = inputs["query"], inputs["key"], inputs["value"], inputs["position_ids"]
    _, heads, seq, dim = q.shape
    if not given:
        pos = np.broadcast_to(np.arange(seq), pos.shape)
    rows = int(pos.max()) + 1
    if name in HF_CONFIGS:
        r = client.post(f"/v1/rope/from-config?max_position={rows}&dtype=float64", json=HF_CONFIGS[name])
    else:
        r = client.get(f"/v1/rope?max_position={rows}&{ROPE_QUERY[name]}&dtype=float64")
    assert r.status_code == 200, r.text
    tables = safetensors_load(r.content)
    cos, sin = tables["cos"][pos][:, None], tables["sin"][pos][:, None]  # [B, 1, S, D]

    def rot(x: np.ndarray) -> np.ndarray:
        return x * cos + rotate_half(x) * sin

    q, k = rot(q.astype(np.float64)), rot(k.astype(np.float64))
    v = rot(v.astype(np.float64)) if rope_v else v.astype(np.float64)
    group = heads // k.shape[1]
    k, v = (np.tile(k, (1, group, 1, 1)), np.tile(v, (1, group, 1, 1))) if tile else (
        np.repeat(k, group, axis=1), np.repeat(v, group, axis=1))
    scores = q @ k.transpose(0, 1, 3, 2) * (scale or 1 / math.sqrt(dim))
    if causal:
        scores[..., np.triu_indices(seq, 1)[0], np.triu_indices(seq, 1)[1]] = -np.inf
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True) @ v).astype(np.float32)


def infer_body(inputs: dict[str, np.ndarray], expected: np.ndarray | None) -> dict[str, Any]:
    tensors = {**inputs, **({"expected_output": expected} if expected is not None else {})}
    return kserve_request(tensors, binary=False).header


CASES = [
    ("rope_attention", {}, None),
    ("rope_attention", {"causal": False}, "causal_mask_missing"),
    ("rope_attention", {"scale": 1 / 64}, "scale_1_over_d"),
    ("rope_attention", {"rope_v": True}, "rope_on_value"),
    ("rope_attention", {"given": False}, "positions_not_passed"),
    ("llama3_1_attention", {}, None),
    ("llama3_1_attention", {"tile": True}, "gqa_grouping"),
    # a correct port of each new kind of attention matches: yarn, longrope, MQA (whose kv head every query
    # head reads, so no grouping mistake is possible)
    ("qwen2_5_7b_yarn_attention", {}, None),
    ("phi3_5_mini_attention", {}, None),
    ("gemma_2b_attention", {}, None),
]


@pytest.mark.parametrize(("name", "mistake", "cause"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_planted_attention_mistake(client: TestClient, name: str, mistake: dict[str, Any], cause: str | None) -> None:
    hq, hkv, d = geometry(name)
    inputs = random_inputs(hq, hkv, d, 1, 12, start=20)
    if cause == "positions_not_passed":  # two packed sequences: ids with a gap
        inputs["position_ids"] = np.concatenate([np.arange(6), np.arange(30, 36)])[None, :]
    r = client.post(f"/v2/models/{name}/check", json=infer_body(inputs, port(client, name, inputs, **mistake)))
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["golden_table"] == {"method": "POST", "url": f"/v2/models/{name}/infer"}
    if cause is None:
        assert doc["verdict"] == "matches" and doc["likely_cause"] is None
        assert not any(entry["explains"] for entry in doc["diagnosis"])
    else:
        assert doc["verdict"] == "mismatch" and doc["likely_cause"] == cause, json.dumps(doc["diagnosis"][:2])
        assert doc["diagnosis"][0]["residual"] < 5e-5


def test_missing_or_misshapen_expected_output(client: TestClient) -> None:
    inputs = random_inputs(8, 8, 64, 1, 4)
    r = client.post("/v2/models/rope_attention/check", json=infer_body(inputs, None))
    assert r.status_code == 400 and "expected_output" in r.json()["error"]
    r = client.post("/v2/models/rope_attention/check", json=infer_body(inputs, np.zeros((1, 8, 3, 64), np.float32)))
    assert r.status_code == 422 and "[1, 8, 4, 64]" in r.json()["error"]
    assert client.post("/v2/models/nope/check", json=infer_body(inputs, None)).status_code == 404
    assert client.post("/v2/models/rope_attention/check", content=b"{", headers={
        "Content-Type": "application/json"}).status_code == 400


def test_attention_work_bound_is_413() -> None:
    with running_client(max_table_bytes=10_000) as c:
        inputs = random_inputs(8, 8, 64, 1, 8)
        r = c.post("/v2/models/rope_attention/check", json=infer_body(inputs, np.zeros((1, 8, 8, 64), np.float32)))
        assert r.status_code == 413 and "hypotheses" in r.json()["error"]
