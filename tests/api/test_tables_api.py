"""The shared table path through HTTP, exercised on /v1/sinusoidal: formats, ETag/304, cache, limits, errors."""

import io
import json
import resource

import ml_dtypes
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load

from posenc.models.sinusoidal import sinusoidal_table
from posenc.service.codec.encode import decode_json_tensor
from tests.conftest import running_client

URL = "/v1/sinusoidal?max_position=16&dim=12&variant=marian"


def expected(dtype: type = np.float32) -> np.ndarray:
    return sinusoidal_table(16, 12, "marian", dtype=dtype)


def test_safetensors_is_the_default(client: TestClient) -> None:
    r = client.get(URL)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-safetensors"
    tensors = safetensors_load(r.content)
    np.testing.assert_array_equal(tensors["pe"], expected())


def test_safetensors_metadata_has_resolved_parameters(client: TestClient) -> None:
    r = client.get(URL)
    (n,) = np.frombuffer(r.content[:8], dtype="<u8")
    metadata = json.loads(r.content[8:8 + int(n)])["__metadata__"]
    assert metadata["variant"] == "marian" and metadata["dim"] == "12" and metadata["base"] == "10000.0"
    assert metadata["posenc_version"] and metadata["endpoint"] == "sinusoidal"


@pytest.mark.parametrize(("query", "accept"), [("&format=npy", None), ("", "application/x-npy")])
def test_npy(client: TestClient, query: str, accept: str | None) -> None:
    r = client.get(URL + query, headers={"Accept": accept} if accept else {})
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-npy"
    np.testing.assert_array_equal(np.load(io.BytesIO(r.content), allow_pickle=False), expected())


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "bfloat16"])
def test_raw(client: TestClient, dtype: str) -> None:
    r = client.get(URL + f"&format=raw&dtype={dtype}")
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-tensor-name"] == "pe"
    assert r.headers["x-tensor-dtype"] == dtype
    assert r.headers["x-tensor-shape"] == "16,12"
    np_type = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    got = np.frombuffer(r.content, dtype=np_type).reshape(16, 12)
    np.testing.assert_array_equal(got, expected(np_type))


def test_json(client: TestClient) -> None:
    r = client.get(URL + "&format=json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc["tensors"]["pe"]["shape"] == [16, 12] and doc["metadata"]["variant"] == "marian"
    np.testing.assert_array_equal(decode_json_tensor(doc["tensors"]["pe"]), expected())


def test_bfloat16_safetensors(client: TestClient) -> None:
    r = client.get(URL + "&dtype=bfloat16")
    header_len = int(np.frombuffer(r.content[:8], dtype="<u8")[0])
    assert json.loads(r.content[8:8 + header_len])["pe"]["dtype"] == "BF16"
    got = np.frombuffer(r.content[8 + header_len:], dtype=ml_dtypes.bfloat16).reshape(16, 12)
    np.testing.assert_array_equal(got, expected(ml_dtypes.bfloat16))


def test_npy_with_bfloat16_is_a_400(client: TestClient) -> None:
    r = client.get(URL + "&dtype=bfloat16&format=npy")
    assert r.status_code == 400
    assert "bfloat16" in r.json()["error"] and r.json()["type"] == "bad_request"


def test_tensor_selection(client: TestClient) -> None:
    assert client.get(URL + "&format=npy&tensor=pe").status_code == 200
    r = client.get(URL + "&tensor=cos")
    assert r.status_code == 422 and "tensor" in r.json()["error"] and "pe" in r.json()["error"]


@pytest.mark.parametrize("fmt", ["npy", "raw"])
def test_a_single_tensor_format_of_two_tensors_needs_the_choice(client: TestClient, fmt: str) -> None:
    """/v1/rope/mrope/positions answers two tensors (position_ids, rope_deltas): one of them, or safetensors."""
    url, body = "/v1/rope/mrope/positions?mrope_section=1,1,2", {"segments": [{"type": "text", "length": 3}]}
    r = client.post(f"{url}&format={fmt}", json=body)
    assert r.status_code == 400 and "carries one tensor" in r.json()["error"]
    assert "position_ids, rope_deltas" in r.json()["error"]
    assert client.post(f"{url}&format={fmt}&tensor=rope_deltas", json=body).status_code == 200


@pytest.mark.parametrize(("query", "accept"), [("&format=xml", None), ("", "text/html"), ("&format=", None)])
def test_unknown_format_is_406(client: TestClient, query: str, accept: str | None) -> None:
    r = client.get(URL + query, headers={"Accept": accept} if accept else {})
    assert r.status_code == 406 and r.json()["type"] == "not_acceptable"
    assert "safetensors" in r.json()["error"]


def test_etag_and_304(client: TestClient) -> None:
    first = client.get(URL)
    etag = first.headers["etag"]
    assert etag.startswith('"') and not etag.startswith("W/")
    assert first.headers["cache-control"] == "public, max-age=86400"
    for value in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        again = client.get(URL, headers={"If-None-Match": value})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag
    assert client.get(URL, headers={"If-None-Match": '"other"'}).status_code == 200


def test_etag_differs_per_parameter_and_format(client: TestClient) -> None:
    tags = {client.get(url).headers["etag"] for url in (
        URL, URL + "&format=npy", URL + "&dtype=float64", URL.replace("dim=12", "dim=14"),
        URL + "&offset=1", URL.replace("marian", "paper"))}
    assert len(tags) == 6


def test_identical_requests_are_served_from_the_cache(client: TestClient) -> None:
    first = client.get(URL + "&offset=3")
    second = client.get(URL + "&offset=3")
    assert first.headers["x-cache"] == "miss" and second.headers["x-cache"] == "hit"
    assert first.content == second.content
    cache = client.app.state.process.table_cache  # type: ignore[attr-defined]
    assert cache.size_bytes >= len(first.content)


def test_cache_can_be_disabled() -> None:
    with running_client(cache_bytes=0) as c:
        assert c.get(URL).headers["x-cache"] == "miss"
        assert c.get(URL).headers["x-cache"] == "miss"


@pytest.mark.parametrize(("query", "names"), [
    ("max_position=0&dim=8", ["max_position", ">= 1"]),
    ("max_position=-5&dim=8", ["max_position", ">= 1"]),
    ("dim=8", ["max_position", "missing"]),
    ("max_position=8", ["dim", "missing"]),
    ("max_position=8&dim=0", ["dim", ">= 1"]),
    ("max_position=8&dim=70000", ["dim", "<= 65536"]),
    ("max_position=99999999999&dim=8", ["max_position", "<="]),
    ("max_position=abc&dim=8", ["max_position", "integer"]),
    ("max_position=8&dim=1.5", ["dim", "integer"]),
    ("max_position=8&dim=8&variant=rotary", ["variant", "paper"]),
    ("max_position=8&dim=8&base=0", ["base", ">= 1e-300"]),
    ("max_position=8&dim=8&base=nan", ["base"]),
    ("max_position=8&dim=8&offset=-1", ["offset", ">= 0"]),
    ("max_position=8&dim=8&dtype=int8", ["dtype", "float32"]),
    ("max_position=8&dim=3&variant=fairseq", ["dim", "at least 4"]),
])
def test_bad_parameters_are_422_naming_the_parameter(client: TestClient, query: str, names: list[str]) -> None:
    r = client.get("/v1/sinusoidal?" + query)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["type"] == "invalid_parameter"
    for word in names:
        assert word in body["error"]


def test_too_large_is_413_before_allocating(client: TestClient) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(20):
        r = client.get("/v1/sinusoidal?max_position=2000000000&dim=65536&dtype=float64")
        assert r.status_code == 413
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert "POSENC_MAX_TABLE_BYTES" in r.json()["error"] and "1048576000000000 bytes" in r.json()["error"]
    # ~1 PB was asked for 20 times; peak RSS (KiB) must not have moved by more than a few MiB.
    assert after - before < 16 * 1024


def test_limit_is_configurable() -> None:
    with running_client(max_table_bytes=1000) as c:
        assert c.get("/v1/sinusoidal?max_position=25&dim=10").status_code == 200  # 1000 bytes
        r = c.get("/v1/sinusoidal?max_position=26&dim=10")
        assert r.status_code == 413 and "1040 bytes" in r.json()["error"]


def test_json_is_limited_to_small_tables() -> None:
    with running_client(max_json_elements=100) as c:
        assert c.get("/v1/sinusoidal?max_position=10&dim=10&format=json").status_code == 200
        r = c.get("/v1/sinusoidal?max_position=11&dim=10&format=json")
        assert r.status_code == 413 and "format=safetensors" in r.json()["error"]
        assert c.get("/v1/sinusoidal?max_position=11&dim=10").status_code == 200


@pytest.mark.parametrize(("query", "disposition"), [
    ("/v1/rope?max_position=4&head_dim=8", 'attachment; filename="rope.safetensors"'),
    ("/v1/rope?max_position=4&head_dim=8&format=npy&tensor=cos", 'attachment; filename="rope-cos.npy"'),
    ("/v1/sinusoidal?max_position=4&dim=8&format=raw", 'attachment; filename="sinusoidal-pe.bin"'),
    ("/v1/rope?max_position=4&head_dim=8&format=png&tensor=sin", 'inline; filename="rope-sin.png"'),  # shown, not saved
])
def test_the_download_is_named_after_the_endpoint_and_its_one_tensor(client: TestClient, query: str,
                                                                     disposition: str) -> None:
    assert client.get(query).headers["Content-Disposition"] == disposition
