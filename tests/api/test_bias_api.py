"""HTTP surface of the bias endpoints: every wire format, the T5 weight upload, and bad input."""

import io
import json
import resource
import tracemalloc
from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load
from safetensors.numpy import save as safetensors_save

from posenc.models.alibi import alibi_bias, alibi_slopes
from posenc.models.deberta import deberta_buckets
from posenc.models.relative import clipped_relative_indices
from posenc.models.t5 import t5_bias, t5_buckets
from posenc.service.codec.encode import decode_json_tensor
from posenc.service.tables import TABLES
from tests.conftest import running_client

# (url, tensor name, expected array)
ENDPOINTS: list[tuple[str, str, Callable[[], np.ndarray]]] = [
    ("/v1/alibi/slopes?num_heads=12", "slopes", lambda: alibi_slopes(12).astype(np.float32)),
    ("/v1/alibi/slopes?num_heads=6&alibi_bias_max=4&dtype=float64", "slopes", lambda: alibi_slopes(6, 4.0)),
    ("/v1/alibi/bias?num_heads=5&query_length=3&key_length=7", "bias", lambda: alibi_bias(5, 3, 7)),
    ("/v1/alibi/bias?num_heads=3&query_length=4&key_length=4&mode=symmetric&dtype=float16", "bias",
     lambda: alibi_bias(3, 4, 4, "symmetric", dtype="float16")),
    ("/v1/alibi/bias?num_heads=3&query_length=2&key_length=5&mode=bloom&mask=true", "bias",
     lambda: alibi_bias(3, 2, 5, "bloom", mask=True)),
    ("/v1/alibi/bias?num_heads=12&query_length=5&key_length=5&mode=mpt&mask=true&dtype=float64", "bias",
     lambda: alibi_bias(12, 5, 5, "mpt", mask=True, dtype="float64")),
    ("/v1/t5/buckets?query_length=6&key_length=9", "buckets", lambda: t5_buckets(6, 9)),
    ("/v1/t5/buckets?query_length=1&key_length=200&bidirectional=false&num_buckets=16&max_distance=64"
     "&offset=150&dtype=int32", "buckets", lambda: t5_buckets(1, 200, False, 16, 64, 150, "int32")),
    ("/v1/deberta/buckets?query_length=5&key_length=300", "relative_positions", lambda: deberta_buckets(5, 300)),
    ("/v1/deberta/buckets?query_length=40&key_length=3&position_buckets=16&max_relative_positions=32"
     "&dtype=int32", "relative_positions", lambda: deberta_buckets(40, 3, 16, 32, "int32")),
    ("/v1/relative/clipped?query_length=4&key_length=6&max_relative_position=2", "indices",
     lambda: clipped_relative_indices(4, 6, 2)),
]
IDS = [url.split("?")[0].removeprefix("/v1/") + f"-{i}" for i, (url, _, _) in enumerate(ENDPOINTS)]


def decode(response, fmt: str, name: str, dtype: np.dtype) -> np.ndarray:  # type: ignore[no-untyped-def]
    assert response.status_code == 200, response.text
    if fmt == "safetensors" and dtype == ml_dtypes.bfloat16:  # safetensors.numpy has no BF16
        header_len = int(np.frombuffer(response.content[:8], "<u8")[0])
        entry = json.loads(response.content[8:8 + header_len])[name]
        assert entry["dtype"] == "BF16"
        begin, end = entry["data_offsets"]
        data = response.content[8 + header_len + begin:8 + header_len + end]
        return np.frombuffer(data, ml_dtypes.bfloat16).reshape(entry["shape"])
    if fmt == "safetensors":
        return safetensors_load(response.content)[name]
    if fmt == "npy":
        return np.load(io.BytesIO(response.content), allow_pickle=False)
    if fmt == "raw":
        assert response.headers["x-tensor-name"] == name
        shape = [int(n) for n in response.headers["x-tensor-shape"].split(",")]
        raw_dtype = ml_dtypes.bfloat16 if response.headers["x-tensor-dtype"] == "bfloat16" else dtype
        return np.frombuffer(response.content, dtype=raw_dtype).reshape(shape)
    return decode_json_tensor(response.json()["tensors"][name])


@pytest.mark.parametrize("fmt", ["safetensors", "npy", "raw", "json"])
@pytest.mark.parametrize(("url", "name", "expected"), ENDPOINTS, ids=IDS)
def test_every_endpoint_in_every_format(client: TestClient, url: str, name: str,
                                        expected: Callable[[], np.ndarray], fmt: str) -> None:
    want = expected()
    r = client.get(f"{url}&format={fmt}")
    got = decode(r, fmt, name, want.dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    assert r.headers["etag"] and r.headers["cache-control"] == "public, max-age=86400"
    assert client.get(f"{url}&format={fmt}", headers={"If-None-Match": r.headers["etag"]}).status_code == 304


def test_bfloat16_bias_in_safetensors_and_raw_not_npy(client: TestClient) -> None:
    url = "/v1/alibi/bias?num_heads=4&query_length=3&key_length=3&mode=bloom&dtype=bfloat16"
    want = alibi_bias(4, 3, 3, "bloom", dtype="bfloat16")
    for fmt in ("safetensors", "raw"):
        got = decode(client.get(f"{url}&format={fmt}"), fmt, "bias", np.dtype(ml_dtypes.bfloat16))
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got, want)
    r = client.get(f"{url}&format=npy")
    assert r.status_code == 400 and "bfloat16" in r.json()["error"]


def test_metadata_names_the_resolved_parameters(client: TestClient) -> None:
    r = client.get("/v1/alibi/bias?num_heads=2&query_length=3&key_length=8&mode=symmetric")
    (n,) = np.frombuffer(r.content[:8], dtype="<u8")
    metadata = json.loads(r.content[8:8 + int(n)])["__metadata__"]
    assert metadata["mode"] == "symmetric" and metadata["mask"] == "false" and metadata["alibi_bias_max"] == "8.0"
    assert metadata["first_query_position"] == "5" and metadata["endpoint"] == "alibi/bias"


# ------------------------------------------------------------------------------------- T5 upload


WEIGHT = np.random.default_rng(0).standard_normal((32, 6)).astype(np.float32)
T5_URL = "/v1/t5/bias?query_length=5&key_length=9"


def npy_body(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=array.dtype == object)
    return buffer.getvalue()


@pytest.mark.parametrize(("content_type", "body"), [
    ("application/x-safetensors", safetensors_save({"weight": WEIGHT})),
    ("application/x-safetensors", safetensors_save({"relative_attention_bias": WEIGHT})),
    ("application/x-npy", npy_body(WEIGHT)),
    ("application/octet-stream", npy_body(WEIGHT)),
    ("application/octet-stream", safetensors_save({"weight": WEIGHT})),
], ids=["safetensors", "safetensors-only-tensor", "npy", "sniffed-npy", "sniffed-safetensors"])
@pytest.mark.parametrize("fmt", ["safetensors", "npy", "raw", "json"])
def test_t5_bias_upload(client: TestClient, content_type: str, body: bytes, fmt: str) -> None:
    r = client.post(f"{T5_URL}&format={fmt}", content=body, headers={"Content-Type": content_type})
    got = decode(r, fmt, "bias", np.dtype(np.float32))
    np.testing.assert_array_equal(got, t5_bias(WEIGHT, 5, 9))
    assert got.shape == (6, 5, 9)


def test_t5_bias_parameters_and_dtype(client: TestClient) -> None:
    weight = WEIGHT[:16].astype(np.float64)
    url = "/v1/t5/bias?query_length=2&key_length=40&bidirectional=false&num_buckets=16&max_distance=20&offset=7"
    r = client.post(url, content=npy_body(weight), headers={"Content-Type": "application/x-npy"})
    got = safetensors_load(r.content)["bias"]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, t5_bias(weight, 2, 40, False, 16, 20, 7))
    r = client.post(url + "&dtype=bfloat16&format=raw", content=npy_body(weight),
                    headers={"Content-Type": "application/x-npy"})
    assert r.headers["x-tensor-dtype"] == "bfloat16" and r.headers["x-tensor-shape"] == "6,2,40"
    values = decode(r, "raw", "bias", np.dtype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(values, t5_bias(weight, 2, 40, False, 16, 20, 7).astype(ml_dtypes.bfloat16))


def test_t5_bias_etag_hashes_the_weight(client: TestClient) -> None:
    def post(weight: np.ndarray):  # type: ignore[no-untyped-def]
        return client.post(T5_URL, content=npy_body(weight), headers={"Content-Type": "application/x-npy"})

    first, again, other = post(WEIGHT), post(WEIGHT), post(WEIGHT + 1)
    assert first.headers["etag"] == again.headers["etag"] != other.headers["etag"]
    assert again.headers["x-cache"] == "hit" and other.headers["x-cache"] == "miss"
    metadata = json.loads(other.content[8:8 + int(np.frombuffer(other.content[:8], "<u8")[0])])["__metadata__"]
    assert len(metadata["weight_sha256"]) == 64 and metadata["weight_shape"] == "32,6"


def test_t5_bias_matching_if_none_match_is_412_on_post(client: TestClient) -> None:
    # RFC 9110 13.1.2: 304 is for GET/HEAD only; a POST whose precondition fails gets 412.
    headers = {"Content-Type": "application/x-npy"}
    etag = client.post(T5_URL, content=npy_body(WEIGHT), headers=headers).headers["etag"]
    r = client.post(T5_URL, content=npy_body(WEIGHT), headers={**headers, "If-None-Match": etag})
    assert r.status_code == 412 and r.json()["type"] == "precondition_failed"
    r = client.post(T5_URL, content=npy_body(WEIGHT), headers={**headers, "If-None-Match": '"other"'})
    assert r.status_code == 200


# ---------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("url", "words"), [
    ("/v1/alibi/slopes?num_heads=0", ["num_heads", ">= 1"]),
    ("/v1/alibi/slopes?num_heads=-4", ["num_heads", ">= 1"]),
    ("/v1/alibi/slopes?num_heads=99999999999", ["num_heads", "<="]),
    ("/v1/alibi/slopes", ["num_heads", "missing"]),
    ("/v1/alibi/slopes?num_heads=8&alibi_bias_max=0", ["alibi_bias_max", "> 0"]),
    ("/v1/alibi/slopes?num_heads=8&alibi_bias_max=nan", ["alibi_bias_max"]),
    ("/v1/alibi/slopes?num_heads=8&dtype=int64", ["dtype", "float32"]),
    ("/v1/alibi/bias?num_heads=8&query_length=0&key_length=4", ["query_length", ">= 1"]),
    ("/v1/alibi/bias?num_heads=8&query_length=4&key_length=4&mode=alibi", ["mode", "causal"]),
    ("/v1/alibi/bias?num_heads=8&query_length=4&key_length=4&mask=maybe", ["mask"]),
    ("/v1/t5/buckets?query_length=4&key_length=4&num_buckets=3", ["num_buckets", ">= 4"]),
    ("/v1/t5/buckets?query_length=4&key_length=4&num_buckets=1&bidirectional=false", ["num_buckets", ">= 2"]),
    ("/v1/t5/buckets?query_length=4&key_length=4&max_distance=8", ["max_distance", "> 8"]),
    ("/v1/t5/buckets?query_length=4&key_length=4&max_distance=16&bidirectional=false", ["max_distance", "> 16"]),
    ("/v1/t5/buckets?query_length=4&key_length=4&offset=-1", ["offset", ">= 0"]),
    ("/v1/t5/buckets?query_length=4&key_length=4&dtype=float32", ["dtype", "int64"]),
    ("/v1/deberta/buckets?query_length=4&key_length=4&position_buckets=1", ["position_buckets", ">= 2"]),
    ("/v1/deberta/buckets?query_length=4&key_length=4&max_relative_positions=100", ["max_relative_positions",
                                                                                    "129"]),
    ("/v1/relative/clipped?query_length=4&key_length=4", ["max_relative_position", "missing"]),
    ("/v1/relative/clipped?query_length=4&key_length=4&max_relative_position=-1", ["max_relative_position"]),
])
def test_bad_parameters_are_422_naming_the_parameter(client: TestClient, url: str, words: list[str]) -> None:
    r = client.get(url)
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "invalid_parameter"
    for word in words:
        assert word in r.json()["error"]


def test_odd_num_buckets_follows_the_reference(client: TestClient) -> None:
    """Bidirectional 33 buckets: 16 per direction as transformers floors it; bucket 32 never appears."""
    r = client.get("/v1/t5/buckets?query_length=1&key_length=4000&num_buckets=33&format=npy")
    buckets = np.load(io.BytesIO(r.content))
    assert buckets.max() == 31 and buckets.min() == 0
    np.testing.assert_array_equal(buckets, t5_buckets(1, 4000, True, 33, 128))


@pytest.mark.parametrize(("content_type", "body", "status", "words"), [
    ("application/x-npy", npy_body(WEIGHT[:16]), 422, ["weight", "num_buckets=32"]),
    ("application/x-npy", npy_body(WEIGHT.reshape(32, 2, 3)), 422, ["weight", "2-D"]),
    ("application/x-npy", npy_body(WEIGHT.astype(np.int32)), 422, ["weight", "float"]),
    ("application/x-npy", npy_body(WEIGHT)[:-4], 400, ["npy", "bytes"]),
    ("application/x-npy", npy_body(np.array([None] * 32, dtype=object).reshape(32, 1))[:128], 400,
     ["allow_pickle"]),
    ("application/x-safetensors", safetensors_save({"weight": WEIGHT})[:100], 400, ["safetensors"]),
    ("application/x-safetensors", b"", 400, ["truncated"]),
    ("application/x-safetensors", safetensors_save({"a": WEIGHT, "b": WEIGHT}), 400, ["weight", "a, b"]),
    ("text/plain", b"1,2,3", 415, ["application/x-npy", "application/x-safetensors"]),
    ("application/octet-stream", b"garbage bytes here", 400, ["neither"]),
], ids=lambda value: f"{len(value)}B" if isinstance(value, bytes) else None)
def test_bad_t5_uploads(client: TestClient, content_type: str, body: bytes, status: int,
                        words: list[str]) -> None:
    r = client.post(T5_URL, content=body, headers={"Content-Type": content_type})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "type"}
    for word in words:
        assert word in r.json()["error"]


def test_upload_over_the_request_limit_is_413() -> None:
    with running_client(max_request_bytes=1000) as c:
        body = npy_body(WEIGHT)  # 896 bytes of data + header
        r = c.post(T5_URL, content=body + b"\0" * 1000, headers={"Content-Type": "application/x-npy"})
        assert r.status_code == 413 and "POSENC_MAX_REQUEST_BYTES" in r.json()["error"]
        assert c.post(T5_URL, content=body, headers={"Content-Type": "application/x-npy"}).status_code == 200


@pytest.mark.parametrize("url", [
    "/v1/alibi/bias?num_heads=100000&query_length=100000&key_length=100000",
    "/v1/alibi/bias?num_heads=1048576&query_length=16777216&key_length=16777216&dtype=float64",
    "/v1/t5/buckets?query_length=16777216&key_length=16777216",
    "/v1/deberta/buckets?query_length=100000&key_length=100000&dtype=int32",
    "/v1/relative/clipped?query_length=100000&key_length=100000&max_relative_position=16",
])
def test_too_large_is_413_immediately(client: TestClient, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused from the parameters alone: the table is never computed and nothing table-sized is allocated."""
    query, computed = TABLES[url.partition("?")[0]].query, []
    compute = query.compute
    monkeypatch.setattr(query, "compute", lambda self: computed.append(self) or compute(self))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        r = client.get(url)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status_code == 413 and "POSENC_MAX_TABLE_BYTES" in r.json()["error"]
    assert computed == []
    assert peak < 4 << 20, peak  # bytes traced (numpy's buffers included) while the request was answered
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 16 * 1024  # KiB
    small = client.get(url.replace("100000", "10").replace("16777216", "10").replace("1048576", "2"))
    assert small.status_code == 200 and len(computed) == 1  # a table within the limit is computed, and counted


def test_t5_bias_output_over_the_limit_is_413() -> None:
    with running_client(max_table_bytes=10_000) as c:
        r = c.post("/v1/t5/bias?query_length=100&key_length=100", content=npy_body(WEIGHT),
                   headers={"Content-Type": "application/x-npy"})
        assert r.status_code == 413 and "240000 bytes" in r.json()["error"]


def test_openapi_documents_every_parameter(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = {"/v1/alibi/slopes": "get", "/v1/alibi/bias": "get", "/v1/t5/buckets": "get", "/v1/t5/bias": "post",
             "/v1/deberta/buckets": "get", "/v1/relative/clipped": "get"}
    for path, method in paths.items():
        operation = spec["paths"][path][method]
        for parameter in operation["parameters"]:
            assert parameter.get("description"), (path, parameter["name"])
        names = {p["name"] for p in operation["parameters"]}
        assert {"format", "tensor"} <= names
    t5_params = {p["name"]: p for p in spec["paths"]["/v1/t5/buckets"]["get"]["parameters"]}
    assert t5_params["num_buckets"]["schema"]["default"] == 32 and t5_params["num_buckets"]["schema"]["minimum"] == 2
    assert "odd" in t5_params["num_buckets"]["description"]
    body = spec["paths"]["/v1/t5/bias"]["post"]["requestBody"]["content"]
    assert {"application/x-safetensors", "application/x-npy"} <= set(body)


def test_mpt_slopes_past_float32_range_are_zero_not_an_error(client: TestClient) -> None:
    """MPT's float32 power 2^(k·max/N) overflows for a large alibi_bias_max: the slope is 0, as in the reference."""
    response = client.get("/v1/alibi/slopes?num_heads=5&alibi_bias_max=1024&format=json")
    assert response.status_code == 200, response.text
    response = client.get("/v1/properties/alibi?num_heads=5&query_length=64&key_length=3&mode=mpt&alibi_bias_max=1024")
    assert response.status_code == 200, response.text
