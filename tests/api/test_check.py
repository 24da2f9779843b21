"""`POST /v1/check/...`: planted porting mistakes are diagnosed as themselves, golden tables match,
bad uploads get the 4xx of `POST /v1/t5/bias`, and the work bound is a 413 before anything is computed."""

import json
import math
import resource
import struct
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load
from safetensors.numpy import save as safetensors_save

from posenc.models.t5 import t5_relative_position_bucket
from posenc.service.codec.decode import decode_safetensors
from tests.conftest import running_client

Tensors = dict[str, np.ndarray]
ST = {"Content-Type": "application/x-safetensors"}
ROPE = "max_position=64&head_dim=32"
WEIGHT = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)


def load(body: bytes) -> Tensors:
    """Every tensor of a safetensors body (bfloat16 included, which safetensors.numpy cannot load)."""
    (length,) = struct.unpack_from("<Q", body)
    names = [n for n in json.loads(body[8:8 + length]) if n != "__metadata__"]
    return {name: decode_safetensors(body, name) for name in names}


def fetch(client: TestClient, url: str, **post: bytes) -> Tensors:
    r = client.post(url, content=post["body"], headers=ST) if post else client.get(url)
    assert r.status_code == 200, r.text
    return load(r.content)


def check(client: TestClient, url: str, tensors: Tensors) -> dict:
    r = client.post(url, content=safetensors_save(tensors), headers=ST)
    assert r.status_code == 200, r.text
    return r.json()


def swapped(t: Tensors) -> Tensors:
    return {"cos": t["sin"], "sin": t["cos"]}


def float32_angles(t: Tensors) -> Tensors:
    """transformers' forward: position × inv_freq, cos and sin in float32."""
    rows = t["cos"].shape[0]
    angles = np.arange(rows, dtype=np.float32)[:, None] * t["inv_freq"][None, :]
    return {"cos": np.tile(np.cos(angles), 2), "sin": np.tile(np.sin(angles), 2)}


def via(dtype: npt.DTypeLike) -> Callable[[Tensors], Tensors]:
    return lambda t: {k: v.astype(dtype).astype(np.float32) for k, v in t.items() if k != "inv_freq"}


def t5_float64_log(rel: np.ndarray, num_buckets: int, max_distance: int) -> np.ndarray:
    """T5's bidirectional bucket written the obvious way, python float64 math per element."""
    half, out = num_buckets // 2, np.zeros(rel.shape, dtype=np.int64)
    exact = half // 2
    for index, r in np.ndenumerate(rel):
        n = abs(int(r))
        large = exact + int(math.log(max(n, exact) / exact) / math.log(max_distance / exact) * (half - exact))
        out[index] = (half if r > 0 else 0) + (n if n < exact else min(large, half - 1))
    return out


def key_minus_query(q: int, k: int, offset: int = 0) -> np.ndarray:
    return np.arange(k)[None, :] - (np.arange(q)[:, None] + offset)


# (golden table the user's port produced, transform of it, check URL, expected cause)
PLANTED: list[tuple[str, Callable[[Tensors], Tensors], str, str]] = [
    (f"/v1/rope?{ROPE}&layout=interleaved", lambda t: t, f"/v1/check/rope?{ROPE}", "layout"),
    (f"/v1/rope?{ROPE}", swapped, f"/v1/check/rope?{ROPE}", "cos_sin_swapped"),
    (f"/v1/rope?{ROPE}&offset=1", lambda t: t, f"/v1/check/rope?{ROPE}", "offset_+1"),
    (f"/v1/rope?{ROPE}&offset=4", lambda t: t, f"/v1/check/rope?{ROPE}&offset=5", "offset_-1"),
    (f"/v1/rope?{ROPE}&rope_theta=500000", lambda t: t, f"/v1/check/rope?{ROPE}", "theta"),
    (f"/v1/rope?{ROPE}", lambda t: t, f"/v1/check/rope?{ROPE}&rope_type=linear&factor=4", "scaling_not_applied"),
    (f"/v1/rope?{ROPE}&rope_type=linear&factor=16", lambda t: t, f"/v1/check/rope?{ROPE}&rope_type=linear&factor=4",
     "scaling_applied_twice"),
    (f"/v1/rope?{ROPE}&rope_type=yarn&factor=4&original_max_position_embeddings=16&attention_factor=1", lambda t: t,
     f"/v1/check/rope?{ROPE}&rope_type=yarn&factor=4&original_max_position_embeddings=16",
     "attention_factor_missing"),
    # exponents over head_dim = 64 with theta 10000 are exponents over 32 with theta 100
    ("/v1/rope?max_position=64&head_dim=32&rope_theta=100", lambda t: t,
     "/v1/check/rope?max_position=64&head_dim=64&rotary_dim=32", "partial_rotary"),
    (f"/v1/rope?{ROPE}&max_position=4096", float32_angles, f"/v1/check/rope?{ROPE}&max_position=4096",
     "float32_angles"),
    (f"/v1/rope?{ROPE}", via(np.float16), f"/v1/check/rope?{ROPE}", "float16_storage"),
    (f"/v1/rope?{ROPE}", via(ml_dtypes.bfloat16), f"/v1/check/rope?{ROPE}", "bfloat16_storage"),
    ("/v1/sinusoidal?max_position=32&dim=16&offset=1", lambda t: t, "/v1/check/sinusoidal?max_position=32&dim=16",
     "offset_+1"),
    ("/v1/sinusoidal?max_position=32&dim=16&offset=2", lambda t: t,
     "/v1/check/sinusoidal?max_position=32&dim=16&offset=3", "offset_-1"),
    ("/v1/sinusoidal?max_position=32&dim=16&variant=fairseq&offset=2", lambda t: t,
     "/v1/check/sinusoidal?max_position=32&dim=16&variant=fairseq", "padding_offset"),
    ("/v1/sinusoidal?max_position=32&dim=16&variant=tensor2tensor", lambda t: t,
     "/v1/check/sinusoidal?max_position=32&dim=16", "variant_tensor2tensor"),
    ("/v1/sinusoidal?max_position=32&dim=16", lambda t: {"pe": t["pe"].reshape(32, 8, 2)[:, :, ::-1].reshape(32, 16)},
     "/v1/check/sinusoidal?max_position=32&dim=16", "sin_cos_swapped"),
    ("/v1/sinusoidal?max_position=32&dim=16", via(np.float16), "/v1/check/sinusoidal?max_position=32&dim=16",
     "float16_storage"),
    ("/v1/alibi/slopes?num_heads=12", lambda t: {"slopes": t["slopes"][::-1].copy()},
     "/v1/check/alibi/slopes?num_heads=12", "head_order_reversed"),
    ("/v1/alibi/slopes?num_heads=12", lambda t: {"slopes": np.concatenate([t["slopes"][8:], t["slopes"][:8]])},
     "/v1/check/alibi/slopes?num_heads=12", "head_order_extras_first"),
    ("/v1/alibi/slopes?num_heads=12", lambda t: {"slopes": np.exp2(-8 * np.arange(1, 13) / 12).astype(np.float32)},
     "/v1/check/alibi/slopes?num_heads=12", "head_count_formula"),
    ("/v1/alibi/bias?num_heads=6&query_length=4&key_length=4",
     lambda t: {"bias": np.concatenate([t["bias"][4:], t["bias"][:4]])},
     "/v1/check/alibi/bias?num_heads=6&query_length=4&key_length=4", "head_order_extras_first"),
    # 12 heads: slopes 2^(−k/2), not all representable in float16
    ("/v1/alibi/bias?num_heads=12&query_length=4&key_length=4", via(np.float16),
     "/v1/check/alibi/bias?num_heads=12&query_length=4&key_length=4", "float16_storage"),
    ("/v1/t5/buckets?query_length=4&key_length=80&num_buckets=19",
     lambda t: {"buckets": t5_float64_log(key_minus_query(4, 80), 19, 128)},
     "/v1/check/t5/buckets?query_length=4&key_length=80&num_buckets=19", "t5_float64_log"),
    ("/v1/t5/buckets?query_length=6&key_length=9",
     lambda t: {"buckets": t5_relative_position_bucket(-key_minus_query(6, 9))},
     "/v1/check/t5/buckets?query_length=6&key_length=9", "relative_sign"),
    ("/v1/t5/buckets?query_length=6&key_length=9&bidirectional=false", lambda t: t,
     "/v1/check/t5/buckets?query_length=6&key_length=9", "bidirectional"),
    ("/v1/t5/buckets?query_length=6&key_length=9&offset=1", lambda t: t,
     "/v1/check/t5/buckets?query_length=6&key_length=9", "offset_+1"),
    ("/v1/deberta/buckets?query_length=5&key_length=300", lambda t: {"relative_positions": -t["relative_positions"]},
     "/v1/check/deberta/buckets?query_length=5&key_length=300", "relative_sign"),
    ("/v1/relative/clipped?query_length=4&key_length=6&max_relative_position=2",
     lambda t: {"indices": 4 - t["indices"]},
     "/v1/check/relative/clipped?query_length=4&key_length=6&max_relative_position=2", "relative_sign"),
]


@pytest.mark.parametrize(("golden", "mistake", "url", "cause"), PLANTED,
                         ids=[f"{p[3]}-{p[2].split('?')[0]}" for p in PLANTED])
def test_planted_mistake_is_diagnosed(client: TestClient, golden: str, mistake: Callable[[Tensors], Tensors],
                                      url: str, cause: str) -> None:
    upload = {k: v for k, v in mistake(fetch(client, golden)).items() if k != "inv_freq"}
    doc = check(client, url, upload)
    if cause == "float32_angles":  # transformers' own arithmetic: within the contract, so no mistake applies
        assert doc["verdict"] == "matches" and doc["diagnosis"] == [] and doc["likely_cause"] is None
        return
    first = doc["diagnosis"][0]
    assert first["name"] == cause, json.dumps(doc["diagnosis"][:3])
    assert first["explains"] and first["residual"] <= 1e-6
    assert doc["verdict"] == "mismatch" and doc["likely_cause"] == cause
    assert cause in doc["summary"]


def test_theta_is_estimated(client: TestClient) -> None:
    upload = {k: v for k, v in fetch(client, f"/v1/rope?{ROPE}&rope_theta=500000").items() if k != "inv_freq"}
    theta = check(client, f"/v1/check/rope?{ROPE}", upload)["diagnosis"][0]
    assert theta["name"] == "theta" and theta["found"] == {"rope_theta": "500000.0"}


GOLDEN = [
    f"/v1/rope?{ROPE}", f"/v1/rope?{ROPE}&layout=interleaved&offset=7", f"/v1/rope?{ROPE}&form=half",
    f"/v1/rope?{ROPE}&rope_type=yarn&factor=4&original_max_position_embeddings=16&dtype=bfloat16",
    "/v1/rope?max_position=16&head_dim=64&partial_rotary_factor=0.5&dtype=float16",
    "/v1/sinusoidal?max_position=32&dim=16", "/v1/sinusoidal?max_position=9&dim=7&variant=marian&dtype=float64",
    "/v1/alibi/slopes?num_heads=12", "/v1/alibi/bias?num_heads=5&query_length=3&key_length=7&mode=bloom&mask=true",
    "/v1/t5/buckets?query_length=6&key_length=9", "/v1/deberta/buckets?query_length=5&key_length=300&dtype=int32",
    "/v1/relative/clipped?query_length=4&key_length=6&max_relative_position=2",
]


@pytest.mark.parametrize("golden", GOLDEN)
def test_golden_table_matches(client: TestClient, golden: str) -> None:
    path, query = golden.split("?")
    golden_tables = fetch(client, golden)
    doc = check(client, f"/v1/check/{path.removeprefix('/v1/')}?{query}", golden_tables)
    assert doc["verdict"] == "matches" and doc["likely_cause"] is None
    assert all(a["max_abs"] == 0 and a["first_failure"] is None for a in doc["agreement"].values())
    assert doc["golden_table"]["method"] == "GET" and doc["golden_table"]["url"].startswith(path + "?")
    again = fetch(client, doc["golden_table"]["url"])  # the URL given back fetches the same table
    assert again.keys() == golden_tables.keys()
    for name, value in golden_tables.items():
        np.testing.assert_array_equal(again[name].view(np.uint8), value.view(np.uint8))


def test_t5_bias_with_its_weight(client: TestClient) -> None:
    golden = fetch(client, "/v1/t5/bias?query_length=5&key_length=7&offset=1",
                   body=safetensors_save({"weight": WEIGHT}))
    doc = check(client, "/v1/check/t5/bias?query_length=5&key_length=7", {"bias": golden["bias"], "weight": WEIGHT})
    assert doc["likely_cause"] == "offset_+1"
    doc = check(client, "/v1/check/t5/bias?query_length=5&key_length=7&offset=1",
                {"bias": golden["bias"], "weight": WEIGHT})
    assert doc["verdict"] == "matches" and doc["golden_table"]["method"] == "POST"
    r = client.post("/v1/check/t5/bias?query_length=5&key_length=7", content=safetensors_save(golden), headers=ST)
    assert r.status_code == 400 and "weight" in r.json()["error"]


def test_rope_from_config(client: TestClient) -> None:
    config = {"head_dim": 32, "rope_theta": 10000.0, "max_position_embeddings": 64}
    golden = fetch(client, f"/v1/rope?{ROPE}&offset=1")
    url = "/v1/check/rope/from-config?config=" + quote(json.dumps(config))
    doc = check(client, url, {"cos": golden["cos"], "sin": golden["sin"]})
    assert doc["likely_cause"] == "offset_+1"
    r = client.post("/v1/check/rope/from-config", content=safetensors_save(golden), headers=ST)
    assert r.status_code == 422 and "config" in r.json()["error"]


def test_mismatch_agreement_figures(client: TestClient) -> None:
    golden = fetch(client, "/v1/sinusoidal?max_position=200&dim=8")
    pe = golden["pe"].copy()
    pe[150:, 3] += 0.01
    doc = check(client, "/v1/check/sinusoidal?max_position=200&dim=8", {"pe": pe})
    agreement = doc["agreement"]["pe"]
    assert doc["verdict"] == "mismatch" and doc["likely_cause"] is None
    assert agreement["first_failure"] == [150, 3] and agreement["max_abs"] == pytest.approx(0.01, rel=1e-4)
    assert agreement["exact_match_rate"] == pytest.approx(1 - 50 / 1600)
    assert len(agreement["rows"]["max_abs"]) <= 64 and agreement["columns"]["max_abs"][3] > 0
    assert agreement["columns"]["max_abs"][2] == 0
    r = client.post("/v1/check/sinusoidal?max_position=200&dim=8&format=safetensors",
                    content=safetensors_save({"pe": pe}), headers=ST)
    errors = safetensors_load(r.content)
    assert errors["pe.row_max_abs_error"].shape == (200,) and errors["pe.row_max_abs_error"][149] == 0
    assert errors["pe.row_max_abs_error"][150] > 0


def test_npy_upload_names_its_tensor(client: TestClient) -> None:
    from posenc.service.codec.encode import encode_npy

    golden = fetch(client, f"/v1/rope?{ROPE}")
    r = client.post(f"/v1/check/rope?{ROPE}&tensor=sin", content=encode_npy(golden["sin"]),
                    headers={"Content-Type": "application/x-npy"})
    assert r.status_code == 200 and set(r.json()["agreement"]) == {"sin"} and r.json()["verdict"] == "matches"


NPY_PREFIX = b"\x93NUMPY\x01\x00"


@pytest.mark.parametrize(("content_type", "body", "status", "words"), [
    ("application/x-npy", NPY_PREFIX + b"\x10\x00{'descr': '<f4'", 400, ["npy", "truncated"]),
    ("application/x-npy", NPY_PREFIX + b"\x40\x00{'descr': '|O', 'fortran_order': False, 'shape': (2,), }" + b" " * 10,
     400, ["allow_pickle"]),
    ("application/x-safetensors", safetensors_save({"pe": np.zeros((4, 8), np.float32)})[:40], 400, ["safetensors"]),
    ("application/x-safetensors", b"", 400, ["truncated"]),
    ("application/x-safetensors", safetensors_save({"a": np.zeros(2), "b": np.zeros(2)}), 400, ["a, b", "pe"]),
    ("application/x-safetensors", safetensors_save({"pe": np.zeros((4, 7), np.float32)}), 422, ["pe", "[4, 8]"]),
    ("application/x-safetensors", safetensors_save({"pe": np.zeros((4, 8), np.int32)}), 422, ["pe", "int32"]),
    ("text/plain", b"1,2,3", 415, ["application/x-npy", "application/x-safetensors"]),
    ("application/octet-stream", b"garbage bytes here", 400, ["neither"]),
], ids=lambda value: f"{len(value)}B" if isinstance(value, bytes) else None)
def test_bad_uploads(client: TestClient, content_type: str, body: bytes, status: int, words: list[str]) -> None:
    r = client.post("/v1/check/sinusoidal?max_position=4&dim=8", content=body, headers={"Content-Type": content_type})
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "type"}
    for word in words:
        assert word in r.json()["error"]


@pytest.mark.parametrize(("url", "status"), [
    ("/v1/check/sinusoidal?max_position=4", 422), ("/v1/check/sinusoidal?max_position=4&dim=8&format=npy", 406),
    ("/v1/check/rope?max_position=4&head_dim=7", 422),
])
def test_bad_parameters(client: TestClient, url: str, status: int) -> None:
    r = client.post(url, content=safetensors_save({"pe": np.zeros((4, 8), np.float32)}), headers=ST)
    assert r.status_code == status, r.text


def test_work_bound_is_413_before_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    with running_client(max_table_bytes=100_000) as c:
        small = fetch(c, "/v1/sinusoidal?max_position=16&dim=16")
        assert check(c, "/v1/check/sinusoidal?max_position=16&dim=16", small)["verdict"] == "matches"
        # the table alone fits the limit; with its hypotheses it does not
        assert c.get("/v1/sinusoidal?max_position=512&dim=16").status_code == 200
        work = count_work(monkeypatch, "/v1/sinusoidal", "/v1/rope")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = c.post("/v1/check/sinusoidal?max_position=512&dim=16", content=b"\0" * 10, headers=ST)
        assert r.status_code == 413 and "hypotheses" in r.json()["error"], r.text
        r = c.post("/v1/check/rope?max_position=1048576&head_dim=4096", content=b"\0" * 10, headers=ST)
        assert r.status_code == 413
        assert work == []  # refused from the parameters: no body read, no table computed
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 16 * 1024  # KiB
        check(c, "/v1/check/sinusoidal?max_position=16&dim=16", small)
        assert work[0] == "body read" and "/v1/sinusoidal computed" in work  # a check that runs is counted


def count_work(monkeypatch: pytest.MonkeyPatch, *paths: str) -> list[str]:
    """What the check routes read and compute from now on: each body read, each table of `paths` computed."""
    import posenc.service.check.routes
    from posenc.service.tables import TABLES

    work: list[str] = []
    read_body = posenc.service.check.routes.read_body

    async def counted_read(*args: Any, **kwargs: Any) -> bytes:
        work.append("body read")
        return await read_body(*args, **kwargs)

    monkeypatch.setattr(posenc.service.check.routes, "read_body", counted_read)
    for path in paths:
        compute = TABLES[path].query.compute

        def counted_compute(self: Any, compute: Callable[[Any], Any] = compute, path: str = path) -> Any:
            work.append(f"{path} computed")
            return compute(self)

        monkeypatch.setattr(TABLES[path].query, "compute", counted_compute)
    return work


def test_every_registered_table_has_a_check_route(client: TestClient) -> None:
    from posenc.service.check.routes import checkable
    from posenc.service.tables import TABLES

    paths = client.get("/openapi.json").json()["paths"]
    routes = [route for route in TABLES.values() if checkable(route)]
    assert {"/v1/rope", "/v1/rope/from-config", "/v1/t5/bias", "/v1/sinusoidal"} <= {r.path for r in routes}
    for route in routes:
        assert "/v1/check/" + route.path.removeprefix("/v1/") in paths


def test_a_family_without_hypotheses_gets_the_agreement(client: TestClient) -> None:
    """Families registered elsewhere (here M-RoPE, a JSON-bodied POST table) are checkable as they land."""
    from posenc.service.tables import TABLES

    assert "/v1/rope/mrope" in TABLES
    body = json.dumps({"segments": [{"type": "text", "length": 4}, {"type": "image", "grid_thw": [1, 4, 6]}]})
    query = "model=qwen2_vl&head_dim=64&mrope_section=8,12,12&rope_theta=1000000"
    r = client.post(f"/v1/rope/mrope?{query}", content=body, headers={"Content-Type": "application/json"})
    golden = load(r.content)
    mine = {"cos": golden["cos"], "sin": golden["sin"]}
    doc = check(client, f"/v1/check/rope/mrope?{query}&config={quote(body)}", mine)
    assert doc["verdict"] == "matches" and doc["golden_table"]["method"] == "POST"
    mine["sin"] = mine["sin"].copy()
    mine["sin"][3, 5] += 0.5
    doc = check(client, f"/v1/check/rope/mrope?{query}&config={quote(body)}", mine)
    assert doc["verdict"] == "mismatch" and doc["agreement"]["sin"]["first_failure"] == [3, 5]


def test_check_names_a_bad_tensor_before_bounding_the_work(client: TestClient) -> None:
    """An unknown ?tensor= (the empty one included) is a 422 even when the table would be over the work limit."""
    response = client.post("/v1/check/sinusoidal?max_position=290654&dim=45901&tensor=", content=b"x")
    assert response.status_code == 422 and "tensor" in response.json()["error"]
