"""Properties of every encoding against independent computations (posenc.models.properties), and the
/v1/properties routes (same parameters, formats, ETag and limits as the tables)."""

import io
import math

import ml_dtypes
import numpy as np
import pytest
from fastapi.testclient import TestClient

from posenc.models.alibi import alibi_slopes
from posenc.models.properties.learned import learned_properties
from posenc.models.properties.measures import first_collision_position
from posenc.models.properties.rope import decay_bound, rope_properties
from posenc.models.properties.sinusoidal import sinusoidal_properties
from posenc.models.rope import make_rope_parameters
from posenc.models.sinusoidal import paper_frequencies, sinusoidal_table
from posenc.models.t5 import t5_relative_position_bucket
from posenc.service.codec.encode import decode_json_tensor
from tests.conftest import running_client


def roformer_bound_by_definition(theta: np.ndarray, delta: int) -> float:
    """(1/(d/2)) Σ_{j=1}^{d/2} |Σ_{i<j} e^{iΔθ_i}|, term by term."""
    half = len(theta)
    total = 0.0
    for j in range(1, half + 1):
        s = sum(complex(math.cos(delta * float(theta[i])), math.sin(delta * float(theta[i]))) for i in range(j))
        total += abs(s)
    return total / half


def test_decay_bound_is_roformers_definition() -> None:
    theta = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    distances = np.array([0, 1, 7, 100, 2047])
    expected = [roformer_bound_by_definition(theta, int(d)) for d in distances]
    np.testing.assert_allclose(decay_bound(theta, distances), expected, rtol=1e-12)
    assert decay_bound(theta, np.array([0]))[0] == pytest.approx((1 + 8) / 2)  # Σ_j j / (d/2) at Δ = 0


def test_rope_relativity_exact_in_float64_and_at_the_dtype_precision() -> None:
    params = make_rope_parameters(head_dim=64)
    residual = {dt: rope_properties(params, 1024, 0, np.dtype(dt), 128, 0).scalars["relativity_max_residual"]
                for dt in ("float64", "float32", "float16")}
    bf16 = rope_properties(params, 1024, 0, np.dtype(ml_dtypes.bfloat16), 128, 0).scalars["relativity_max_residual"]
    assert residual["float64"] < 1e-14
    # rounding the table to the dtype: residual about its unit roundoff (a few ulps), ordered by precision
    assert 1e-10 < residual["float32"] < 2 ** -22
    assert 2 ** -14 < residual["float16"] < 2 ** -8
    assert residual["float16"] < bf16 < 2 ** -5


def test_rope_norm_and_equivariance() -> None:
    scalars = rope_properties(make_rope_parameters(head_dim=32), 64, 5, np.dtype(np.float64), 64, 3).scalars
    assert scalars["norm_max_deviation"] < 1e-14
    assert scalars["equivariance_no_position"] < 1e-12  # attention alone: permutation-equivariant
    assert scalars["equivariance_rope_fixed_positions"] > 1e-3  # positions stay in their slots: not
    assert scalars["equivariance_rope_moving_positions"] < 1e-12  # positions move with the tokens: again


def test_rope_uniqueness_extrapolation_and_scaling() -> None:
    params = make_rope_parameters(head_dim=16, rope_type="linear", factor=4.0)
    measured = rope_properties(params, 256, 0, np.dtype(np.float32), 16, 0)
    curves, scalars = measured.curves, measured.scalars
    theta = curves["inv_freq"].astype(np.float64)
    cos, sin = np.cos(np.outer(np.arange(256), theta)), np.sin(np.outer(np.arange(256), theta))
    rows = np.concatenate([cos, sin, cos, sin], axis=1)  # the full-form [cos | sin] row, columns reordered
    brute = np.linalg.norm(rows - rows[0], axis=1)
    np.testing.assert_allclose(curves["pair_distance"], brute, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(curves["frequency_scale"], 4.0, rtol=1e-6)  # linear divides every frequency by 4
    np.testing.assert_allclose(curves["wavelength"], 2 * np.pi / theta)
    assert scalars["context_length"] == 256  # linear names no training context: the table's rows
    assert scalars["turning_dimensions"] == int(np.sum(2 * np.pi / theta <= 256)) == 3


def test_first_collision_matches_brute_force() -> None:
    table = sinusoidal_table(3000, 2, "paper", dtype=np.dtype(ml_dtypes.bfloat16))  # [sin p, cos p] in 8 bits
    rows = [tuple(r.astype(np.float64)) for r in table]
    brute = next(i for i, r in enumerate(rows) if r in rows[:i])
    assert first_collision_position(table) == brute
    assert first_collision_position(table.astype(np.float64)) is None or \
        first_collision_position(sinusoidal_table(3000, 2, dtype=np.float64)) is None


@pytest.mark.parametrize("variant", ["paper", "tensor2tensor", "fairseq", "marian"])
def test_sinusoidal_relativity_is_a_block_rotation(variant: str) -> None:
    exact = sinusoidal_properties(512, 32, variant, 10000.0, 0, 1, np.dtype(np.float64), 128, 0)  # type: ignore[arg-type]
    half = sinusoidal_properties(512, 32, variant, 10000.0, 0, 1, np.dtype(np.float16), 128, 0)  # type: ignore[arg-type]
    assert exact.scalars["relativity_max_residual"] < 1e-12
    assert 1e-5 < half.scalars["relativity_max_residual"] < 1e-2


def test_sinusoidal_dot_product_depends_on_distance_only() -> None:
    measured = sinusoidal_properties(300, 16, "paper", 10000.0, 0, 1, np.dtype(np.float32), 8, 0)
    omega = paper_frequencies(8, 16, 10000.0)
    delta = np.arange(300)
    np.testing.assert_allclose(measured.curves["dot_product"], np.cos(np.outer(delta, omega)).sum(axis=1),
                               atol=1e-12)
    np.testing.assert_allclose(measured.curves["pair_distance"],
                               np.sqrt((2 - 2 * np.cos(np.outer(delta, omega))).sum(axis=1)), atol=1e-12)


def test_learned_table_of_sinusoids_looks_sinusoidal() -> None:
    rng = np.random.default_rng(0)
    table = sinusoidal_table(256, 32, dtype=np.float64) + rng.normal(0, 0.01, (256, 32))
    curves, scalars = learned_properties(table.astype(np.float32))
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    np.testing.assert_allclose(curves["cosine_similarity"], unit @ unit.T, atol=1e-5)
    assert scalars["nearest_is_neighbour"] == 1.0
    # the highest-frequency column (ω = 1 rad/position) is learned at 1/(2π) cycles per position
    assert curves["dominant_frequency"][0] == pytest.approx(1 / (2 * np.pi), abs=1 / 256)
    shuffled = learned_properties(rng.permutation(table).astype(np.float32))[1]
    assert shuffled["nearest_is_neighbour"] < 0.2


def json_tensors(response: object) -> dict[str, np.ndarray]:
    doc = response.json()  # type: ignore[attr-defined]
    return {name: decode_json_tensor(t) for name, t in doc["tensors"].items()}


def test_rope_properties_route(client: TestClient) -> None:
    url = "/v1/properties/rope?max_position=128&head_dim=32&rope_theta=500000&dtype=bfloat16&format=json"
    response = client.get(url)
    assert response.status_code == 200, response.text
    tensors, metadata = json_tensors(response), response.json()["metadata"]
    expected = rope_properties(make_rope_parameters(head_dim=32, rope_theta=500000.0), 128, 0,
                               np.dtype(ml_dtypes.bfloat16), 256, 0)
    np.testing.assert_array_equal(tensors["decay_bound"], expected.curves["decay_bound"])
    assert float(metadata["relativity_max_residual"]) == expected.scalars["relativity_max_residual"]
    again = client.get(url, headers={"If-None-Match": response.headers["ETag"]})
    assert again.status_code == 304
    assert client.get(url).headers["X-Cache"] == "hit"


def test_properties_routes_refuse_what_they_cannot_measure(client: TestClient) -> None:
    too_long = client.get("/v1/properties/rope?max_position=70000&head_dim=8")
    assert too_long.status_code == 422 and "max_position" in too_long.json()["error"]
    assert client.get("/v1/properties/rope?max_position=8&head_dim=8&pairs=0").status_code == 422
    heavy = client.get("/v1/properties/rope?max_position=65536&head_dim=512")  # 2^25 values: refused at once
    assert heavy.status_code == 422 and "max_position × rotary_dim" in heavy.json()["error"]
    assert client.get("/v1/properties/sinusoidal?max_position=8&dim=65536&pairs=512").status_code == 422
    assert client.get("/v1/properties/sinusoidal?max_position=8&dim=8&format=npy").status_code == 400


def test_alibi_and_t5_curves(client: TestClient) -> None:
    alibi = json_tensors(client.get("/v1/properties/alibi?num_heads=6&query_length=4&key_length=50&format=json"))
    slopes = alibi_slopes(6)
    offsets = np.arange(-49, 4)
    np.testing.assert_array_equal(alibi["relative_position"], offsets)
    # causal: −m·(query − key) = m·r for every offset r, the future ones included (no mask)
    np.testing.assert_allclose(alibi["bias_by_offset"], slopes[:, None] * offsets[None, :], rtol=1e-6)
    np.testing.assert_allclose(alibi["slopes"], slopes)
    masked = json_tensors(client.get("/v1/properties/alibi?num_heads=2&query_length=3&key_length=5&mask=true"
                                     "&mode=symmetric&format=json"))["bias_by_offset"]
    assert np.isneginf(masked[:, -2:]).all() and np.isfinite(masked[:, :-2]).all()
    np.testing.assert_allclose(masked[:, :-2], -alibi_slopes(2)[:, None] * np.arange(4, -1, -1)[None, :], rtol=1e-6)
    t5 = json_tensors(client.get("/v1/properties/t5?query_length=40&key_length=300&format=json"))
    offsets = np.arange(-39, 300)
    np.testing.assert_array_equal(t5["relative_position"], offsets)
    buckets = t5_relative_position_bucket(offsets)
    np.testing.assert_array_equal(t5["bucket"], buckets)
    starts = [offset for i, offset in enumerate(offsets) if i and buckets[i] != buckets[i - 1]]
    np.testing.assert_array_equal(t5["boundaries"], starts)


def npy_body(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_learned_and_t5_bias_uploads(client: TestClient) -> None:
    table = (sinusoidal_table(64, 16, dtype=np.float64) + 0.01).astype(np.float32)
    response = client.post("/v1/properties/learned?format=json", content=npy_body(table),
                           headers={"Content-Type": "application/x-npy"})
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(json_tensors(response)["cosine_similarity"],
                               learned_properties(table)[0]["cosine_similarity"])
    wrong = client.post("/v1/properties/learned", content=npy_body(np.zeros(5, np.float32)),
                        headers={"Content-Type": "application/x-npy"})
    assert wrong.status_code == 422 and "2-D" in wrong.json()["error"]
    weight = np.arange(64, dtype=np.float32).reshape(32, 2)
    bias = client.post("/v1/properties/t5/bias?query_length=8&key_length=8&format=json", content=npy_body(weight),
                       headers={"Content-Type": "application/x-npy"})
    assert bias.status_code == 200, bias.text
    tensors = json_tensors(bias)
    np.testing.assert_array_equal(tensors["bias_by_offset"], weight[tensors["bucket"]].T)


def test_properties_png_and_its_pixel_limit() -> None:
    with running_client(max_png_pixels=1000) as client:
        picture = client.get("/v1/properties/sinusoidal?max_position=64&dim=16&format=png")
        assert picture.status_code == 200 and picture.content.startswith(b"\x89PNG\r\n\x1a\n")
        assert picture.headers["content-type"] == "image/png" and picture.headers["ETag"]
        big = client.get("/v1/properties/sinusoidal?max_position=1000&dim=16&format=png")
        assert big.status_code == 413 and "POSENC_MAX_PNG_PIXELS" in big.json()["error"]
