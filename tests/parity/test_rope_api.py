"""GET /v1/rope and POST /v1/rope/from-config through the app, against transformers 5.23.

Tolerances: tests/rope_reference.py (precision contract of docs/ENCODINGS.md).
"""

import io
import json
import math
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as load_safetensors

from tests.conftest import running_client
from tests.rope_reference import (
    MODEL_CONFIGS,
    assert_inv_freq_close,
    cos_sin_tolerance,
    forward_cos_sin,
    hf_model_rotary,
    llama_config,
    rotary_module,
)

LLAMA31_QUERY = ("/v1/rope?max_position=8192&head_dim=128&rope_theta=500000&rope_type=llama3&factor=8"
                 "&low_freq_factor=1&high_freq_factor=4&original_max_position_embeddings=8192")


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with running_client(max_table_bytes=64 * 2**20) as test_client:
        yield test_client


def tensors_and_metadata(body: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    header_len = struct.unpack("<Q", body[:8])[0]
    return load_safetensors(body), json.loads(body[8 : 8 + header_len])["__metadata__"]


def assert_matches_forward(tensors: dict[str, np.ndarray], module: Any, offset: int,
                           layer_type: str | None = None) -> None:
    positions = np.arange(offset, offset + tensors["cos"].shape[0])
    ref_cos, ref_sin = forward_cos_sin(module, positions, layer_type)
    inv_freq = tensors["inv_freq"]
    ref_inv = getattr(module, "inv_freq" if layer_type is None else f"{layer_type}_inv_freq").numpy()
    assert_inv_freq_close(inv_freq, ref_inv)
    scale = getattr(module, "attention_scaling" if layer_type is None else f"{layer_type}_attention_scaling")
    tol = np.concatenate([cos_sin_tolerance(positions, inv_freq, float(scale))] * 2, axis=1)  # [rows, d]
    assert tensors["cos"].shape == ref_cos.shape
    assert np.all(np.abs(tensors["cos"] - ref_cos) <= tol)
    assert np.all(np.abs(tensors["sin"] - ref_sin) <= tol)


def test_llama31_curl_example_equals_transformers(client: TestClient) -> None:
    response = client.get(LLAMA31_QUERY)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-safetensors"
    tensors, metadata = tensors_and_metadata(response.content)
    assert tensors["cos"].shape == (8192, 128) and tensors["cos"].dtype == np.float32
    hf = llama_config({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 128, 131072)
    assert_matches_forward(tensors, rotary_module(hf), 0)
    assert metadata["rope_type"] == "llama3" and metadata["attention_factor"] == "1.0"
    assert metadata["rotary_dim"] == "128" and metadata["seq_len"] == "8192"


def test_llama31_from_config_equals_get(client: TestClient) -> None:
    get = tensors_and_metadata(client.get(LLAMA31_QUERY).content)[0]
    response = client.post("/v1/rope/from-config?max_position=8192", json=MODEL_CONFIGS["llama-3.1-8b"])
    assert response.status_code == 200
    posted, metadata = tensors_and_metadata(response.content)
    for name in ("cos", "sin", "inv_freq"):
        assert np.array_equal(posted[name], get[name])
    assert metadata["rope_source"] == "rope_scaling" and metadata["head_dim"] == "128"


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
@pytest.mark.parametrize("where", ["start", "end"])
def test_from_config_matches_the_models_rotary_embedding(client: TestClient, name: str, where: str) -> None:
    config = MODEL_CONFIGS[name]
    layer_type = "full_attention" if "layer_types" in config else None
    offset = 0 if where == "start" else config["max_position_embeddings"] - 24
    query = f"/v1/rope/from-config?max_position=24&offset={offset}"
    if layer_type:
        query += f"&layer_type={layer_type}"
    response = client.post(query, json=config)
    assert response.status_code == 200, response.text
    tensors, metadata = tensors_and_metadata(response.content)
    assert_matches_forward(tensors, hf_model_rotary(config), offset, layer_type)
    if name == "phi-3-mini-128k":
        assert metadata["factor_set"] == ("short" if where == "start" else "long")
        assert float(metadata["attention_factor"]) == pytest.approx(1.1902381, abs=1e-7)


def test_from_config_defaults_to_the_whole_context(client: TestClient) -> None:
    config = {"head_dim": 64, "max_position_embeddings": 300, "rope_theta": 10000.0}
    response = client.post("/v1/rope/from-config?format=npy&tensor=cos", json=config)
    assert response.status_code == 200
    assert np.load(io.BytesIO(response.content)).shape == (300, 64)


def test_v4_type_key_and_v5_rope_parameters_agree(client: TestClient) -> None:
    v4 = {"hidden_size": 2048, "num_attention_heads": 16, "max_position_embeddings": 16384, "rope_theta": 1e6,
          "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}}
    v5 = {"hidden_size": 2048, "num_attention_heads": 16, "max_position_embeddings": 16384,
          "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                              "original_max_position_embeddings": 4096}}
    bodies = [client.post("/v1/rope/from-config?max_position=64&offset=9000", json=c).content for c in (v4, v5)]
    (a, meta_a), (b, meta_b) = (tensors_and_metadata(body) for body in bodies)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert meta_a["attention_factor"] == meta_b["attention_factor"] == repr(0.1 * math.log(4.0) + 1.0)


@pytest.mark.parametrize(("layout", "form", "width"), [("half", "full", 64), ("interleaved", "full", 64),
                                                       ("half", "half", 32)])
def test_layouts_and_forms(client: TestClient, layout: str, form: str, width: int) -> None:
    response = client.get(f"/v1/rope?max_position=5&head_dim=64&layout={layout}&form={form}&format=json")
    cos = response.json()["tensors"]["cos"]
    assert cos["shape"] == [5, width]
    row = np.array(cos["data"]).reshape(5, width)[3]
    first = np.cos(3.0 * 10000.0 ** (-np.arange(0, 64, 2) / 64))
    expected = {"full": np.concatenate([first, first]) if layout == "half" else np.repeat(first, 2), "half": first}
    np.testing.assert_allclose(row, expected[form], atol=1e-6)


def test_form_half_ignores_layout_in_the_cache_key(client: TestClient) -> None:
    etags = {client.get(f"/v1/rope?max_position=5&head_dim=64&form=half&layout={layout}").headers["ETag"]
             for layout in ("half", "interleaved")}
    assert len(etags) == 1
    full = {client.get(f"/v1/rope?max_position=5&head_dim=64&layout={layout}").headers["ETag"]
            for layout in ("half", "interleaved")}
    assert len(full) == 2


def test_not_given_is_absent_not_zero(client: TestClient) -> None:
    # 0 is a value like any other (out of range here), not a spelling of "not given"
    response = client.get("/v1/rope?max_position=4&head_dim=64&rope_type=linear&factor=0")
    assert response.status_code == 422 and response.json()["error"].startswith("factor: must be > 0")
    missing = client.get("/v1/rope?max_position=4&head_dim=64&rope_type=linear")
    assert missing.status_code == 422 and missing.json()["error"].startswith("factor: required")
    explicit = client.get("/v1/rope?max_position=4&head_dim=64&rotary_dim=32&format=npy&tensor=cos")
    assert np.load(io.BytesIO(explicit.content)).shape == (4, 32)


@pytest.mark.parametrize("factor", ["1.0", "0.5", "1"])
def test_rotary_dim_with_any_partial_rotary_factor_is_one_422(client: TestClient, factor: str) -> None:
    # partial_rotary_factor=1.0 used to pass as "not given" while 0.5 was refused
    response = client.get(f"/v1/rope?max_position=4&head_dim=64&rotary_dim=32&partial_rotary_factor={factor}")
    assert response.status_code == 422
    assert response.json()["error"] == "rotary_dim: give either rotary_dim or partial_rotary_factor, not both"


def test_openapi_shows_real_defaults(client: TestClient) -> None:
    parameters = {p["name"]: p for p in client.get("/openapi.json").json()["paths"]["/v1/rope"]["get"]["parameters"]}
    assert parameters["rope_theta"]["schema"]["default"] == 10000.0
    assert parameters["beta_fast"]["schema"]["default"] == 32.0
    for name in ("factor", "rotary_dim", "partial_rotary_factor", "short_factor", "low_freq_factor"):
        assert parameters[name]["schema"].get("default") is None, name  # not given: absent, no sentinel
        assert not parameters[name]["required"], name


def test_raw_bfloat16_and_partial_rotary(client: TestClient) -> None:
    response = client.get("/v1/rope?max_position=16&head_dim=80&partial_rotary_factor=0.4&dtype=bfloat16"
                          "&format=raw&tensor=sin")
    assert response.status_code == 200
    assert response.headers["X-Tensor-Dtype"] == "bfloat16" and response.headers["X-Tensor-Shape"] == "16,32"


def test_table_size_is_checked_before_computing(client: TestClient) -> None:
    response = client.get("/v1/rope?max_position=2000000000&head_dim=128")
    assert response.status_code == 413 and "bytes" in response.json()["error"]


def test_every_parameter_is_documented(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path, method in (("/v1/rope", "get"), ("/v1/rope/from-config", "post")):
        operation = spec["paths"][path][method]
        assert all(p.get("description") for p in operation["parameters"]), path
    assert "requestBody" in spec["paths"]["/v1/rope/from-config"]["post"]


BASE = "/v1/rope?max_position=4&head_dim=64"


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("/v1/rope?max_position=4&head_dim=100&partial_rotary_factor=0.25", "partial_rotary_factor"),
        ("/v1/rope?max_position=4&head_dim=64&rotary_dim=31", "rotary_dim"),
        (BASE + "&rotary_dim=32&partial_rotary_factor=0.5", "rotary_dim"),
        (BASE + "&rope_type=linear&factor=0.5", "factor"),
        (BASE + "&rope_type=ntk", "rope_type"),
        (BASE + "&rope_type=linear", "factor"),
        (BASE + "&rope_type=dynamic&factor=2", "max_position_embeddings"),
        (BASE + "&rope_type=yarn", "factor, original_max_position_embeddings"),
        (BASE + "&rope_type=llama3&factor=8&original_max_position_embeddings=8192",
         "low_freq_factor, high_freq_factor"),
        # low = high: a wavelength exactly at original / low is 0 / 0 in transformers (NaN): refused
        ("/v1/rope?max_position=4&head_dim=2&rope_type=llama3&factor=8&original_max_position_embeddings=1"
         "&low_freq_factor=0.15915494309189535&high_freq_factor=0.15915494309189535", "high_freq_factor"),
        (BASE + "&rope_type=longrope&original_max_position_embeddings=4096&factor=2", "short_factor, long_factor"),
        ("/v1/rope?max_position=4&head_dim=8&rope_type=longrope&original_max_position_embeddings=10&factor=2"
         "&short_factor=1,1,1&long_factor=1,2,3,4", "short_factor"),
        ("/v1/rope?max_position=4&head_dim=8&rope_type=longrope&original_max_position_embeddings=10&factor=2"
         "&short_factor=1,1,1,1&long_factor=1,2,x,4", "long_factor"),
        ("/v1/rope?head_dim=64", "max_position"),
        (BASE + "&layout=gptj", "layout"),
    ],
)
def test_bad_parameters_are_422_naming_them(client: TestClient, query: str, parameter: str) -> None:
    response = client.get(query)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["type"] == "invalid_parameter" and body["error"].startswith(parameter), body


@pytest.mark.parametrize(
    ("body", "status", "parameter"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b"\xff\xfe", 400, None),
        (b" " * (2**20 + 1), 413, None),
        (json.dumps({"rope_theta": 1e4, "max_position_embeddings": 8}).encode(), 422, "head_dim"),
        (json.dumps({"head_dim": 64, "max_position_embeddings": 8, "rope_scaling": {"type": "dynamic"}}).encode(),
         422, "factor"),
        (json.dumps({"head_dim": 64, "max_position_embeddings": 8, "rope_scaling": {"rope_type": "longrope",
                                                                                     "factor": 2.0}}).encode(),
         422, "long_factor, short_factor"),
        (json.dumps({"head_dim": 64, "rope_theta": 1e4}).encode(), 422, "max_position"),
        (json.dumps({"head_dim": 64, "max_position_embeddings": 8, "rope_scaling": {"rope_type": ["yarn"]}}).encode(),
         422, "rope_type"),
        (json.dumps({"head_dim": 64, "max_position_embeddings": 8, "rope_parameters": {"type": {"a": 1}}}).encode(),
         422, "rope_type"),
        # float32 would overflow to inf in transformers' arithmetic: refused, not served as inf/nan
        (json.dumps({"head_dim": 64, "max_position_embeddings": 8, "rope_scaling": {"type": "linear",
                                                                                    "factor": 1e308}}).encode(),
         422, "factor"),
        (json.dumps({"head_dim": 64, "max_position_embeddings": 8, "rope_theta": 1e300}).encode(), 422, "rope_theta"),
    ],
)
def test_bad_configs(client: TestClient, body: bytes, status: int, parameter: str | None) -> None:
    response = client.post("/v1/rope/from-config", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    if parameter is not None:
        assert response.json()["error"].startswith(parameter)
