"""/v1/properties/{deberta,relative,xlnet} against brute-force computations on the tables the family
routes serve."""

from collections import Counter

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load

from posenc.models.properties.relative import toeplitz_violation
from posenc.models.rope_types import default_inv_freq
from tests.api.test_properties import json_tensors
from tests.conftest import running_client


def served(client: TestClient, url: str) -> dict[str, np.ndarray]:
    response = client.get(url)
    assert response.status_code == 200, response.text
    return dict(safetensors_load(response.content))


def brute_index_checks(table: np.ndarray, t: dict[str, np.ndarray], name: str) -> dict[str, object]:
    """Curve, boundaries and sharing of an index table, cell by cell; returns the brute scalars."""
    q, k = table.shape
    curve = {int(r): int(v) for r, v in zip(t["relative_position"], t[name], strict=True)}
    assert sorted(curve) == list(range(-(q - 1), k))
    for i in range(q):
        for j in range(k):
            assert table[i, j] == curve[j - i]
    counts = Counter(curve.values())
    assert [counts[curve[r]] for r in sorted(curve)] == list(t["offsets_per_index"])
    offsets = sorted(curve)
    assert list(t["boundaries"]) == [r for r in offsets[1:] if curve[r] != curve[r - 1]]
    shared = [abs(r) for r in offsets if counts[curve[r]] > 1]
    return {"indices_used": len(counts), "first_shared_distance": min(shared) if shared else None}


def test_deberta_properties_against_the_served_table(client: TestClient) -> None:
    params = "query_length=30&key_length=200&position_buckets=16&max_relative_positions=64"
    table = served(client, f"/v1/deberta/buckets?{params}")["relative_positions"]
    response = client.get(f"/v1/properties/deberta?{params}&dtype=int32&format=json")
    assert response.status_code == 200, response.text
    t, metadata = json_tensors(response), response.json()["metadata"]
    assert t["bucket"].dtype == np.int32
    brute = brute_index_checks(table, t, "bucket")
    assert int(metadata["indices_used"]) == brute["indices_used"]
    assert int(metadata["first_shared_distance"]) == brute["first_shared_distance"]
    curve = dict(zip(t["relative_position"].tolist(), t["bucket"].tolist(), strict=True))
    # bucket(query − key): odd in the offset, decreasing with key − query; exact to position_buckets // 2
    assert all(curve[-r] == -curve[r] for r in range(30))
    assert metadata["sign_convention"] == "query − key" and metadata["symmetry_max_violation"] == "0"
    assert all(curve[r] == -r for r in range(-8, 9)) and int(metadata["exact_up_to"]) >= 8
    assert metadata["toeplitz_max_violation"] == "0"


@pytest.mark.parametrize("k", [0, 3, 40])
def test_clipped_properties_clip_points_and_sharing(client: TestClient, k: int) -> None:
    params = f"query_length=12&key_length=20&max_relative_position={k}"
    table = served(client, f"/v1/relative/clipped?{params}")["indices"]
    response = client.get(f"/v1/properties/relative?{params}&format=json")
    assert response.status_code == 200, response.text
    t, metadata = json_tensors(response), response.json()["metadata"]
    brute = brute_index_checks(table, t, "index")
    np.testing.assert_array_equal(t["index"], np.clip(np.arange(-11, 20), -k, k) + k)
    assert int(metadata["indices_used"]) == brute["indices_used"] == min(k, 11) + min(k, 19) + 1
    if k < 11:  # both clip points inside the table: offsets beyond ±k share the end indices
        clip = (str(-k), str(k)) if k else ("none", "none")  # k = 0: one index, it never changes
        assert (metadata["clip_left"], metadata["clip_right"]) == clip
        assert int(metadata["first_shared_distance"]) == brute["first_shared_distance"] == k
        assert int(metadata["exact_up_to"]) == k
    else:
        assert metadata["first_shared_distance"] == "none" and brute["first_shared_distance"] is None
    assert metadata["sign_convention"] == ("key − query" if k else "none")
    assert metadata["symmetry_max_violation"] == "0" and metadata["toeplitz_max_violation"] == "0"


def test_toeplitz_violation_finds_a_changed_cell() -> None:
    per_offset = np.arange(-3, 5)  # q = 4, k = 5
    table = np.array([[per_offset[j - i + 3] for j in range(5)] for i in range(4)])
    assert toeplitz_violation(table, per_offset) == 0
    table[2, 1] += 7
    assert toeplitz_violation(table, per_offset) == 7


def test_relative_properties_refuse_before_work(client: TestClient) -> None:
    wide = client.get("/v1/properties/relative?query_length=70000&key_length=2&max_relative_position=2")
    assert wide.status_code == 422 and "query_length + key_length" in wide.json()["error"]
    big = client.get("/v1/properties/deberta?query_length=8192&key_length=8192")  # 2^26 cells
    assert big.status_code == 422 and "query_length × key_length" in big.json()["error"]
    xl = client.get("/v1/properties/xlnet?qlen=10&klen=10&d_model=65536&pairs=512")
    assert xl.status_code == 422 and "pairs × d_model" in xl.json()["error"]
    assert client.get("/v1/properties/xlnet?qlen=70000&klen=1&d_model=2").status_code == 422
    with running_client(max_png_pixels=500) as small:
        assert small.get("/v1/properties/relative?query_length=4&key_length=6&max_relative_position=2"
                         "&format=png").status_code == 200
        refused = small.get("/v1/properties/deberta?query_length=200&key_length=200&format=png")
        assert refused.status_code == 413 and "POSENC_MAX_PNG_PIXELS" in refused.json()["error"]


def xlnet_row(distance: int, d_model: int) -> np.ndarray:
    omega = default_inv_freq(10000.0, d_model).astype(np.float64)
    return np.concatenate([np.sin(distance * omega), np.cos(distance * omega)])


def test_xlnet_properties_against_brute_force(client: TestClient) -> None:
    response = client.get("/v1/properties/xlnet?qlen=7&klen=9&d_model=16&dtype=float64&format=json")
    assert response.status_code == 200, response.text
    t, metadata = json_tensors(response), response.json()["metadata"]
    np.testing.assert_array_equal(t["distance"], np.arange(10))
    rows = np.array([xlnet_row(d, 16) for d in range(10)])
    np.testing.assert_allclose(t["dot_product"], rows @ rows[0], atol=1e-12)
    np.testing.assert_allclose(t["pair_distance"], np.linalg.norm(rows - rows[0], axis=1), atol=1e-12)
    table = served(client, "/v1/relative/sinusoidal?qlen=7&klen=9&d_model=16&dtype=float64")["pos_emb"][:, 0]
    np.testing.assert_allclose(t["adjacent_distance"], np.linalg.norm(np.diff(table, axis=0), axis=1), atol=1e-15)
    assert float(metadata["relativity_max_residual"]) < 1e-12 and metadata["clamped_rows"] == "0"
    half = client.get("/v1/properties/xlnet?qlen=7&klen=9&d_model=16&dtype=float16&format=json").json()["metadata"]
    assert 1e-5 < float(half["relativity_max_residual"]) < 1e-2


def test_xlnet_clamp_breaks_relativity_and_uniqueness(client: TestClient) -> None:
    url = "/v1/properties/xlnet?qlen=4&klen=12&d_model=16&attn_type=uni&bi_data=true&clamp_len=5&format=json"
    response = client.get(url)
    assert response.status_code == 200, response.text
    metadata = response.json()["metadata"]
    assert metadata["clamped_rows"] == str(sum(1 for d in range(12, -1, -1) if d > 5)) == "7"
    assert metadata["first_collision_distance"] == "11"  # rows 12 and 11 are both R_5
    assert float(metadata["relativity_max_residual"]) > 0.1
