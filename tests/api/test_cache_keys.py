"""The ETag / response-cache key of the table routes covers everything that changes the answer.

A parameter missing from the key makes two different requests share one cache entry: the second one is
answered with the first one's body (and its ETag, so clients and proxies keep the wrong bytes too).
"""

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load

from posenc.models.sinusoidal import sinusoidal_table
from posenc.service.http.app import create_app
from posenc.service.settings import Settings
from tests.conftest import running_client

# --- the selected tensor (?tensor=) -----------------------------------------------------------------

ROPE_URL = "/v1/rope?max_position=6&head_dim=8&rope_theta=100.0"


@pytest.fixture
def fresh_client() -> Iterator[TestClient]:
    """A client with an empty cache: each test decides which request fills it first."""
    with running_client() as c:
        yield c


def _npy(body: bytes) -> np.ndarray:
    return np.load(io.BytesIO(body), allow_pickle=False)


def test_selected_tensor_is_part_of_the_cache_key_npy(fresh_client: TestClient) -> None:
    """Guards against dropping `tensor` from the key: ?tensor=sin after ?tensor=cos must not get cos."""
    reference = safetensors_load(fresh_client.get(ROPE_URL).content)
    responses = {name: fresh_client.get(f"{ROPE_URL}&format=npy&tensor={name}") for name in ("cos", "sin", "inv_freq")}
    assert all(r.status_code == 200 for r in responses.values())
    assert len({r.headers["etag"] for r in responses.values()}) == 3
    assert len({r.content for r in responses.values()}) == 3
    for name, r in responses.items():
        np.testing.assert_array_equal(_npy(r.content), reference[name])
    assert not np.array_equal(reference["cos"], reference["sin"])


def test_selected_tensor_is_part_of_the_cache_key_raw(fresh_client: TestClient) -> None:
    """Same through format=raw, whose headers name the tensor: body, name and ETag follow ?tensor=."""
    reference = safetensors_load(fresh_client.get(ROPE_URL).content)
    cos = fresh_client.get(f"{ROPE_URL}&format=raw&tensor=cos")
    sin = fresh_client.get(f"{ROPE_URL}&format=raw&tensor=sin")
    assert cos.status_code == sin.status_code == 200
    assert cos.headers["etag"] != sin.headers["etag"] and cos.content != sin.content
    for name, r in (("cos", cos), ("sin", sin)):
        assert r.headers["x-tensor-name"] == name
        got = np.frombuffer(r.content, dtype="<f4").reshape(reference[name].shape)
        np.testing.assert_array_equal(got, reference[name])


# --- fairseq padding_idx ------------------------------------------------------------------------------

FAIRSEQ_URL = "/v1/sinusoidal?max_position=6&dim=8&variant=fairseq&format=npy"


def test_fairseq_padding_idx_is_part_of_the_cache_key(fresh_client: TestClient) -> None:
    """Guards against dropping `padding_idx` from the key: padding_idx=3 after padding_idx=1 must move the zero row."""
    one = fresh_client.get(FAIRSEQ_URL + "&padding_idx=1")
    three = fresh_client.get(FAIRSEQ_URL + "&padding_idx=3")
    assert one.status_code == three.status_code == 200
    assert one.headers["etag"] != three.headers["etag"] and one.content != three.content
    for padding_idx, r in ((1, one), (3, three)):
        table = _npy(r.content)
        zero_rows = [i for i in range(6) if not table[i].any()]
        assert zero_rows == [padding_idx]
        np.testing.assert_array_equal(table, sinusoidal_table(6, 8, "fairseq", padding_idx=padding_idx))


# --- every parameter of every GET table route -------------------------------------------------------

# Smallest valid request of each route (its required parameters); every other value is the route's default.
BASE: dict[str, dict[str, Any]] = {
    "/v1/rope": {"max_position": 6, "head_dim": 16},
    "/v1/sinusoidal": {"max_position": 6, "dim": 8},
    "/v1/alibi/slopes": {"num_heads": 4},
    "/v1/alibi/bias": {"num_heads": 2, "query_length": 3, "key_length": 4},
    "/v1/t5/buckets": {"query_length": 4, "key_length": 40},
    "/v1/deberta/buckets": {"query_length": 4, "key_length": 40},
    "/v1/relative/clipped": {"query_length": 4, "key_length": 6, "max_relative_position": 2},
    "/v1/rope/vision": {"head_dim": 16, "image_size": 64, "patch_size": 16},
    "/v1/rope/vision/tower": {"vision_tower": "qwen2_5_vl", "head_dim": 16, "grid_thw": "1,8,8"},
    "/v1/relative/sinusoidal": {"qlen": 3, "klen": 4, "d_model": 8},
    "/v1/properties/rope": {"max_position": 6, "head_dim": 16},
    "/v1/properties/sinusoidal": {"max_position": 6, "dim": 8},
    "/v1/properties/alibi": {"num_heads": 2, "query_length": 3, "key_length": 4},
    "/v1/properties/t5": {"query_length": 4, "key_length": 40},
    "/v1/properties/deberta": {"query_length": 4, "key_length": 40},
    "/v1/properties/relative": {"query_length": 4, "key_length": 6, "max_relative_position": 2},
    "/v1/properties/xlnet": {"qlen": 3, "klen": 4, "d_model": 8},
    "/v1/properties/rope/vision": {"head_dim": 16, "image_size": 64, "patch_size": 16},
}

# A second valid value per parameter name that changes the table (given the context below).
ALTERNATIVES: dict[str, Any] = {
    "max_position": 7, "head_dim": 32, "dim": 10, "offset": 3, "partial_rotary_factor": 0.5, "rotary_dim": 8,
    "rope_theta": 500000.0, "rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 4096,
    "max_position_embeddings": 4, "attention_factor": 1.5, "beta_fast": 4.0, "beta_slow": 8.0, "mscale": 2.0,
    "mscale_all_dim": 2.0, "truncate": "false", "low_freq_factor": 2.0, "high_freq_factor": 2.0,
    "short_factor": ",".join(["1.5"] * 8), "long_factor": ",".join(["3.0"] * 8), "layout": "interleaved",
    "form": "half", "dtype": "float64", "variant": "marian", "base": 500.0, "padding_idx": 3, "num_heads": 6,
    "alibi_bias_max": 4.0, "query_length": 2, "key_length": 5, "mode": "symmetric", "mask": "true",
    "bidirectional": "false", "num_buckets": 16, "max_distance": 64, "position_buckets": 16,
    "max_relative_positions": 128, "max_relative_position": 1, "pairs": 8, "seed": 1,
}
# Where the name alone does not say (integer tables take integer dtypes).
ROUTE_ALTERNATIVES: dict[tuple[str, str], Any] = {
    ("/v1/t5/buckets", "dtype"): "int32",
    ("/v1/deberta/buckets", "dtype"): "int32",
    ("/v1/relative/clipped", "dtype"): "int32",
    ("/v1/rope", "alpha"): 1000.0,
    ("/v1/rope", "yarn_mscale"): "deepseek",
    ("/v1/rope/vision", "model"): "llama4",
    ("/v1/rope/vision", "image_size"): 128,
    ("/v1/rope/vision", "patch_size"): 32,
    ("/v1/rope/vision", "height"): 2,
    ("/v1/rope/vision", "width"): 3,
    ("/v1/rope/vision/tower", "vision_tower"): "kimi_k25",
    ("/v1/rope/vision/tower", "spatial_merge_size"): 4,
    ("/v1/rope/vision/tower", "window"): 2,  # the default 4 spans the 4 × 4 merged grid: one window
    ("/v1/rope/vision/tower", "grid_thw"): "2,8,8",
    ("/v1/relative/sinusoidal", "qlen"): 5,
    ("/v1/relative/sinusoidal", "klen"): 6,
    ("/v1/relative/sinusoidal", "d_model"): 12,
    ("/v1/relative/sinusoidal", "attn_type"): "uni",
    ("/v1/relative/sinusoidal", "bi_data"): "true",
    ("/v1/relative/sinusoidal", "clamp_len"): 2,
}

_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
_LONGROPE = {"rope_type": "longrope", "factor": 2.0, "short_factor": ",".join(["1.0"] * 8),
             "long_factor": ",".join(["2.0"] * 8)}
_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
# Parameters a route reads only in some configurations: the base request is extended with this first.
CONTEXT: dict[tuple[str, str], dict[str, Any]] = {
    ("/v1/rope", "rope_type"): {"factor": 4.0},
    ("/v1/rope", "factor"): {"rope_type": "linear", "factor": 2.0},
    ("/v1/rope", "original_max_position_embeddings"): {**_YARN, "original_max_position_embeddings": 64},
    ("/v1/rope", "max_position_embeddings"): {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 2},
    ("/v1/rope", "attention_factor"): _YARN,
    ("/v1/rope", "beta_fast"): _YARN,
    ("/v1/rope", "beta_slow"): _YARN,
    ("/v1/rope", "mscale"): {**_YARN, "mscale_all_dim": 1.0},
    ("/v1/rope", "mscale_all_dim"): {**_YARN, "mscale": 1.0},
    ("/v1/rope", "truncate"): _YARN,
    ("/v1/rope", "low_freq_factor"): _LLAMA3,
    ("/v1/rope", "high_freq_factor"): _LLAMA3,
    ("/v1/rope", "short_factor"): {**_LONGROPE, "original_max_position_embeddings": 64},  # 6 rows: short
    ("/v1/rope", "long_factor"): {**_LONGROPE, "original_max_position_embeddings": 4},  # 6 rows > 4: long
    ("/v1/rope", "alpha"): {"rope_type": "dynamic", "factor": 2.0, "max_position_embeddings": 2},
    ("/v1/rope", "yarn_mscale"): {**_YARN, "mscale": 0.5},
    ("/v1/sinusoidal", "padding_idx"): {"variant": "fairseq"},
    ("/v1/deberta/buckets", "position_buckets"): {"position_buckets": 8, "max_relative_positions": 64},
    ("/v1/deberta/buckets", "max_relative_positions"): {"position_buckets": 8, "max_relative_positions": 64},
}
# /v1/properties/X takes the parameters of the table route X, in the same contexts
for _table, _properties in (("/v1/rope", "/v1/properties/rope"), ("/v1/sinusoidal", "/v1/properties/sinusoidal"),
                            ("/v1/t5/buckets", "/v1/properties/t5"), ("/v1/deberta/buckets", "/v1/properties/deberta"),
                            ("/v1/relative/clipped", "/v1/properties/relative"),
                            ("/v1/relative/sinusoidal", "/v1/properties/xlnet"),
                            ("/v1/rope/vision", "/v1/properties/rope/vision")):
    CONTEXT |= {(_properties, name): value for (route, name), value in list(CONTEXT.items()) if route == _table}
    ROUTE_ALTERNATIVES |= {(_properties, name): value for (route, name), value in list(ROUTE_ALTERNATIVES.items())
                           if route == _table}
# the response encoding (covered by the tests above); a preset, which expands to the parameters themselves
# (tests/api/test_presets.py)
NOT_TABLE_PARAMETERS = {"format", "tensor", "preset"}


def _openapi() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def _table_routes(doc: dict[str, Any]) -> dict[str, list[str]]:
    """GET routes under /v1 (the table routes) → names of their query parameters."""
    return {path: [p["name"] for p in item["get"].get("parameters", []) if p["in"] == "query"]
            for path, item in doc["paths"].items()
            if path.startswith("/v1/") and not path.startswith("/v1/presets") and "get" in item}


ROUTE_PARAMETERS = [(route, name) for route, names in _table_routes(_openapi()).items() for name in names
                    if name not in NOT_TABLE_PARAMETERS]


def test_every_get_table_route_has_a_base_request() -> None:
    """A new GET table route must be added to BASE, so that the test below covers its parameters."""
    assert set(_table_routes(_openapi())) == set(BASE)


def _tensors(body: bytes) -> dict[str, np.ndarray]:
    return dict(safetensors_load(body))


def _same_tables(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[n].dtype == b[n].dtype and a[n].shape == b[n].shape and np.array_equal(a[n], b[n]) for n in a
    )


@pytest.mark.parametrize(("route", "parameter"), ROUTE_PARAMETERS, ids=[f"{r}:{p}" for r, p in ROUTE_PARAMETERS])
def test_each_parameter_changes_etag_and_body(client: TestClient, route: str, parameter: str) -> None:
    """Guards against any canonical parameter missing from the cache key (parameters come from OpenAPI, so a
    new parameter fails here until it gets an alternative value)."""
    alternative = ROUTE_ALTERNATIVES.get((route, parameter), ALTERNATIVES.get(parameter))
    assert alternative is not None, f"{route}: add an alternative value for the new parameter {parameter!r}"
    query = {**BASE[route], **CONTEXT.get((route, parameter), {})}
    changed = {**query, parameter: alternative}

    first = client.get(route, params=query)
    second = client.get(route, params=changed)
    assert first.status_code == 200, first.text
    assert second.status_code == 200, second.text
    assert first.headers["etag"] != second.headers["etag"]
    assert first.content != second.content
    assert not _same_tables(_tensors(first.content), _tensors(second.content)), (
        f"{parameter}={alternative!r} does not change the {route} table; pick another value or context"
    )
