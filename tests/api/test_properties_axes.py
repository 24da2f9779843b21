"""/v1/properties/rope/vision and /v1/properties/rope/mrope against brute-force computations on the
tables the family routes serve."""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load

from posenc.models.rope_types import default_inv_freq
from tests.api.test_properties import json_tensors
from tests.conftest import running_client

VISION = "head_dim=16&image_size=80&patch_size=16&height=3&width=5"


def test_vision_uniqueness_against_every_pair_of_patches(client: TestClient) -> None:
    table = dict(safetensors_load(client.get(f"/v1/rope/vision?{VISION}&dtype=float64").content))
    rows = np.concatenate([table["cos"], table["sin"]], axis=1)  # full-form rows, [15, 32]
    response = client.get(f"/v1/properties/rope/vision?{VISION}&dtype=float64&format=json")
    assert response.status_code == 200, response.text
    t, metadata = json_tensors(response), response.json()["metadata"]
    assert t["pair_distance"].shape == (3, 5)
    distances = []
    for a in range(15):
        for b in range(15):
            dh, dw = abs(a // 5 - b // 5), abs(a % 5 - b % 5)
            brute = np.linalg.norm(rows[a] - rows[b])
            assert t["pair_distance"][dh, dw] == pytest.approx(brute, abs=1e-12)
            if a != b:
                distances.append(brute)
    assert float(metadata["min_pair_distance"]) == pytest.approx(min(distances), abs=1e-12)
    assert metadata["first_collision_row"] == "none"
    for name in ("relativity_max_residual_height", "relativity_max_residual_width", "norm_max_deviation"):
        assert float(metadata[name]) < 1e-12, name


def test_vision_wavelengths_per_axis() -> None:
    with running_client() as client:
        t = json_tensors(client.get("/v1/properties/rope/vision?head_dim=16&image_size=160&patch_size=16&height=3"
                                    "&rope_theta=4&format=json"))
    inv_freq = default_inv_freq(4.0, 16)  # Pixtral: even k drive the row (height), odd k the column
    np.testing.assert_array_equal(t["inv_freq"], np.concatenate([inv_freq[0::2], inv_freq[1::2]]))
    np.testing.assert_array_equal(t["axis"], [0] * 4 + [1] * 4)
    wavelength = 2 * np.pi / t["inv_freq"].astype(np.float64)
    np.testing.assert_allclose(t["wavelength"], wavelength)
    np.testing.assert_array_equal(t["completes_turn"], wavelength <= np.array([3] * 4 + [10] * 4))
    assert t["completes_turn"].any() and not t["completes_turn"].all()


def test_llama4_axes_and_cls(client: TestClient) -> None:
    params = "model=llama4&head_dim=16&image_size=64&patch_size=16&dtype=float64"
    table = dict(safetensors_load(client.get(f"/v1/rope/vision?{params}&form=half").content))
    response = client.get(f"/v1/properties/rope/vision?{params}&format=json")
    t, metadata = json_tensors(response), response.json()["metadata"]
    np.testing.assert_array_equal(t["axis"], [1] * 4 + [0] * 4)  # Llama 4: x (width) first, then y (height)
    rows = np.concatenate([table["cos"], table["sin"]], axis=1)  # [17, 16], CLS last
    brute = min(np.sqrt(2) * np.linalg.norm(rows[-1] - rows[p]) for p in range(16))
    assert float(metadata["cls_min_distance"]) == pytest.approx(brute, rel=1e-12)
    assert metadata["span_height"] == metadata["span_width"] == "5"  # patches 1..4 and the CLS at 0


def test_vision_low_precision_and_bounds(client: TestClient) -> None:
    half = client.get(f"/v1/properties/rope/vision?{VISION}&dtype=float16&format=json").json()["metadata"]
    assert 1e-5 < float(half["relativity_max_residual_width"]) < 1e-2
    big = client.get("/v1/properties/rope/vision?head_dim=16&image_size=8192&patch_size=16")  # 512² patches
    assert big.status_code == 422 and "height × width" in big.json()["error"]
    heavy = client.get(f"/v1/properties/rope/vision?{VISION}&head_dim=4096&pairs=8192")
    assert heavy.status_code == 422 and "pairs × head_dim" in heavy.json()["error"]
    with running_client(max_png_pixels=300) as small:
        assert small.get(f"/v1/properties/rope/vision?{VISION}&pairs=8&format=png").status_code == 200
        refused = small.get("/v1/properties/rope/vision?head_dim=16&image_size=640&patch_size=16&format=png")
        assert refused.status_code == 413 and "POSENC_MAX_PNG_PIXELS" in refused.json()["error"]


SEQUENCE = {"segments": [{"type": "text", "length": 3}, {"type": "image", "grid_thw": [1, 4, 6]},
                         {"type": "text", "length": 2}, {"type": "video", "grid_thw": [3, 2, 2]},
                         {"type": "text", "length": 1}], "sequence_length": 40}


def post(client: TestClient, path: str, query: str, body: dict[str, Any]) -> Any:
    response = client.post(f"{path}?{query}", json=body)
    assert response.status_code == 200, response.text
    return response


@pytest.mark.parametrize("model", ["qwen2_vl", "qwen3_vl"])
def test_mrope_properties_against_the_served_rows(client: TestClient, model: str) -> None:
    body = {**SEQUENCE, "segments": [s for s in SEQUENCE["segments"]  # type: ignore[attr-defined]
                                     if model == "qwen2_vl" or s["type"] != "video"][:3]}
    query = f"model={model}&head_dim=16&mrope_section=2,3,3&dtype=float64"
    ids = dict(safetensors_load(post(client, "/v1/rope/mrope/positions", f"model={model}", body).content))
    positions = ids["position_ids"]  # [3, S]
    table = dict(safetensors_load(post(client, "/v1/rope/mrope", query, body).content))
    response = post(client, "/v1/properties/rope/mrope", query + "&format=json", body)
    t, metadata = json_tensors(response), response.json()["metadata"]
    axis = [0, 0, 1, 1, 1, 2, 2, 2] if model == "qwen2_vl" else [0, 1, 2, 0, 1, 2, 0, 1]
    np.testing.assert_array_equal(t["axis"], axis)
    spans = positions.max(axis=1) - positions.min(axis=1) + 1
    for a, name in enumerate("thw"):
        assert metadata[f"span_{name}"] == str(spans[a])
        assert float(metadata[f"relativity_max_residual_{name}"]) < 1e-12
    np.testing.assert_array_equal(t["completes_turn"], t["wavelength"] <= spans[axis])
    rows = np.concatenate([table["cos"], table["sin"]], axis=1)  # served full rows [S, 32]
    np.testing.assert_allclose(t["adjacent_distance"], np.linalg.norm(np.diff(rows, axis=0), axis=1), atol=1e-12)
    assert metadata["distinct_positions"] == str(len({tuple(p) for p in positions.T.tolist()}))
    assert metadata["distinct_rows"] == str(len({r.tobytes() for r in rows[:, :16]}))
    assert metadata["first_collision_token"] == "none" and float(metadata["norm_max_deviation"]) < 1e-12


def test_mrope_collision_in_low_precision_and_bounds(client: TestClient) -> None:
    # t positions 0..2999, h = w = 0, in bfloat16: the row is [cos p, sin p] (and constants) in 8 bits
    body = {"position_ids": [list(range(3000)), [0] * 3000, [0] * 3000]}
    metadata = post(client, "/v1/properties/rope/mrope", "head_dim=6&mrope_section=1,1,1&dtype=bfloat16&format=json",
                    body).json()["metadata"]
    assert metadata["first_collision_token"] == "711" and int(metadata["distinct_rows"]) < 3000
    long = client.post("/v1/properties/rope/mrope?head_dim=16&mrope_section=2,3,3",
                       json={"segments": [{"type": "text", "length": 70000}]})
    assert long.status_code == 422 and "sequence length" in long.json()["error"]
    heavy = client.post("/v1/properties/rope/mrope?head_dim=4096&pairs=8192&mrope_section=600,700,748",
                        json={"segments": [{"type": "text", "length": 4}]})
    assert heavy.status_code == 422 and "pairs × head_dim" in heavy.json()["error"]
    with running_client(max_png_pixels=200) as small:
        assert small.post("/v1/properties/rope/mrope?head_dim=8&mrope_section=1,1,2&pairs=8&format=png",
                          json={"segments": [{"type": "text", "length": 4}]}).status_code == 200
        refused = small.post("/v1/properties/rope/mrope?head_dim=8&mrope_section=1,1,2&format=png",
                             json={"segments": [{"type": "text", "length": 4}]})
        assert refused.status_code == 413 and "POSENC_MAX_PNG_PIXELS" in refused.json()["error"]
