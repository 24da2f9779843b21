"""No value answers a 500 (issue 55, item 9): NaN, infinities, 4,000-digit integers, negative, zero and overflowing
sizes in every numeric field an audit reads (GGUF keys, safetensors shapes, ONNX initializers, the extract,
config.json) and in `POST /v1/rope/from-config` are a 4xx naming the field, or an answer. Each repro of the issue
is its own test; a property test then feeds every such value into every such field."""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.audit_files import SMALL_LLAMA3, genai_onnx, inv_freq_onnx
from tests.conftest import running_client

HUGE = 10**4000


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with running_client() as c:
        yield c


# --- GGUF, written entry by entry: any value type for any key (ggml's writer would refuse these) -------------
GGUF_TYPES = {"u32": (4, "I"), "i64": (11, "q"), "u64": (10, "Q"), "f32": (6, "f"), "f64": (12, "d")}


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def _entry(key: str, kind: str, value: Any) -> bytes:
    if isinstance(value, list):
        code, fmt = GGUF_TYPES[kind]
        return _string(key) + struct.pack("<IIQ", 9, code, len(value)) + struct.pack(f"<{len(value)}{fmt}", *value)
    code, fmt = GGUF_TYPES[kind]
    return _string(key) + struct.pack("<I", code) + struct.pack("<" + fmt, value)


def gguf(entries: dict[str, tuple[str, Any]]) -> bytes:
    """A GGUF header of `general.architecture` = llama and `llama.KEY` entries {KEY: (type, value)}, no tensors."""
    body = _string("general.architecture") + struct.pack("<I", 8) + _string("llama")
    body += b"".join(_entry(f"llama.{key}", kind, value) for key, (kind, value) in entries.items())
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries) + 1) + body


LLAMA = {"context_length": ("u32", 8192), "embedding_length": ("u32", 4096), "attention.head_count": ("u32", 32),
         "attention.head_count_kv": ("u32", 8), "rope.dimension_count": ("u32", 128),
         "rope.freq_base": ("f32", 500000.0)}


def safetensors(entry: bytes, data: int = 16) -> bytes:
    header = b'{"model.rotary_emb.inv_freq": ' + entry + b"}"
    return struct.pack("<Q", len(header)) + header + bytes(data)


def extract(**fields: Any) -> bytes:
    base = {"posenc_audit_extract": 1, "source": "gguf", "context_length": 64, "rotary_dim": 8, "head_dim": 8}
    return json.dumps({**base, **fields}).encode()


def array(shape: Any, values: int = 4) -> dict[str, Any]:
    data = base64.b64encode(np.ones(values, np.float32).tobytes()).decode()
    return {"dtype": "float32", "shape": shape, "data": data}


def config(**fields: Any) -> str:
    """SMALL_LLAMA3's config.json with top-level fields replaced (json.dumps writes NaN and Infinity)."""
    return json.dumps({**SMALL_LLAMA3, **fields})


def refused(response: Any, *words: str) -> str:
    """A 4xx whose message names the field (`words`)."""
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:300])
    message = response.json()["error"]
    assert all(word in message for word in words), message
    return str(message)


# --- the repros of the issue, each its own test ---------------------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_gguf_dimension_sections_of_f32_nan_or_inf(client: TestClient, value: float) -> None:
    body = gguf({**LLAMA, "rope.dimension_sections": ("f32", [value, 24.0, 24.0, 0.0])})
    refused(client.post("/v1/audit", content=body), "llama.rope.dimension_sections", "integer")


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_gguf_context_length_of_f64_inf_or_nan(client: TestClient, value: float) -> None:
    body = gguf({**LLAMA, "context_length": ("f64", value)})
    refused(client.post("/v1/audit", content=body), "llama.context_length", "integer")


def test_gguf_hostile_values_in_the_cli(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`posenc audit FILE` says what is wrong (exit 2, no traceback), as the route's 400 does."""
    from posenc.service.cli.main import main

    path = tmp_path / "nan.gguf"
    path.write_bytes(gguf({**LLAMA, "context_length": ("f64", float("nan")),
                           "rope.dimension_sections": ("f32", [float("inf"), 0.0, 0.0, 0.0])}))
    assert main(["audit", str(path)]) == 2
    assert "llama.context_length must be an integer" in capsys.readouterr().err


def test_safetensors_shape_of_infinity(client: TestClient) -> None:
    body = safetensors(b'{"dtype": "F32", "shape": [Infinity], "data_offsets": [0, 16]}')
    refused(client.post("/v1/audit", content=body), "model.rotary_emb.inv_freq", "shape", "[inf]")


def test_safetensors_shape_whose_product_overflows_int64(client: TestClient) -> None:
    """np.prod([2**32, 2**32]) wraps to 0, which passed both the size bound and the data_offsets span."""
    body = safetensors(b'{"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}')
    refused(client.post("/v1/audit", content=body), "model.rotary_emb.inv_freq", "shape", "elements")


def _initializer_changed(model_bytes: bytes, name: str, **changes: Any) -> bytes:
    from onnx import load_model_from_string

    model = load_model_from_string(model_bytes)
    tensor = next(t for t in model.graph.initializer if t.name == name)
    if "dims" in changes:
        tensor.dims[:] = changes["dims"]
    if "data_type" in changes:
        tensor.data_type = changes["data_type"]
    return bytes(model.SerializeToString())


CACHES = genai_onnx(np.ones((4, 4), np.float16), np.ones((4, 4), np.float16))


@pytest.mark.parametrize(("model", "name", "dims"), [
    (inv_freq_onnx(np.ones(4, np.float32)), "inv_freq", [100]),
    (CACHES, "cos_cache", [8, 8]),
])
def test_onnx_initializer_dims_disagreeing_with_its_data(client: TestClient, model: bytes, name: str,
                                                         dims: list[int]) -> None:
    body = _initializer_changed(model, name, dims=dims)
    refused(client.post("/v1/audit", content=body), f"initializer {name!r}", "dims", "declare")


@pytest.mark.parametrize(("model", "name"), [
    (inv_freq_onnx(np.ones(4, np.float32), attention_factor=2.0), "mscale"),
    (CACHES, "cos_cache"),
])
def test_onnx_initializer_of_data_type_undefined(client: TestClient, model: bytes, name: str) -> None:
    body = _initializer_changed(model, name, data_type=0)
    refused(client.post("/v1/audit", content=body), f"initializer {name!r}", "data_type 0")


def test_extract_shape_of_infinity(client: TestClient) -> None:
    body = extract(inv_freq=array([float("inf")]))
    refused(client.post("/v1/audit", content=body), "inv_freq.shape", "[inf]")


@pytest.mark.parametrize("key", ["head_dim", "rope_theta"])
def test_extract_scaling_naming_a_field_the_audit_sets_itself(client: TestClient, key: str) -> None:
    """`scaling` of {"head_dim": 1} was passed on beside head_dim: TypeError, multiple values for keyword."""
    refused(client.post("/v1/audit", content=extract(scaling={key: 1})), f"scaling.{key}", "not a scaling field")


@pytest.mark.parametrize("field", ["rope_theta", "partial_rotary_factor"])
def test_a_4000_digit_number_in_an_uploaded_config(client: TestClient, field: str) -> None:
    """math.isfinite(10**4000) raised OverflowError; now the config does not build, the verdict says why."""
    response = client.post("/v1/audit", content=config(**{field: HUGE}))
    assert response.status_code == 200, response.text[:300]
    doc = response.json()
    assert doc["mistakes"] == ["config_not_buildable"]
    assert any(f["explanation"].startswith(f"{field}: must be <=") for f in doc["facts"]), doc["facts"]


@pytest.mark.parametrize("field", ["rope_theta", "partial_rotary_factor"])
def test_a_4000_digit_number_in_the_config_query(client: TestClient, field: str) -> None:
    """?config= whose RoPE does not build: a 422 that says the reference cannot be applied and names the problem (as
    for any invalid value), never an audit of internal consistency behind it."""
    body = gguf(LLAMA)
    response = client.post("/v1/audit", params={"config": config(**{field: HUGE})}, content=body)
    assert response.status_code == 422, response.text[:300]
    error = response.json()["error"]
    assert error.startswith(f"config: the given config.json cannot be the audit's reference: {field}: must be <=") \
        and len(error) < 300, error


@pytest.mark.parametrize("field", ["rope_theta", "partial_rotary_factor"])
def test_a_4000_digit_number_in_from_config(client: TestClient, field: str) -> None:
    response = client.post("/v1/rope/from-config", content=config(**{field: HUGE}),
                           headers={"content-type": "application/json"})
    assert len(refused(response, field, "must be <=")) < 200


# --- inv_freq: a vector, or a [2, n] short/long pair; any other first dimension is refused -----------------------

PAIR_OR_VECTOR = "must be a non-empty vector or a [2, n] pair, got shape"


def _inv_freq_safetensors(rows: int) -> bytes:
    return safetensors(json.dumps({"dtype": "F32", "shape": [rows, 4], "data_offsets": [0, rows * 16]}).encode(),
                       rows * 16)


def test_inv_freq_of_3_rows_in_a_safetensors_file(client: TestClient) -> None:
    """[2, n] is the pair the audit reads (no refusal); [3, n] is a 400 naming the tensor and its shape."""
    paired = client.post("/v1/audit", content=_inv_freq_safetensors(2))
    assert paired.status_code == 200, paired.text[:300]
    three = client.post("/v1/audit", content=_inv_freq_safetensors(3))
    assert three.status_code == 400, three.text[:300]
    refused(three, "tensor 'model.rotary_emb.inv_freq'", f"{PAIR_OR_VECTOR} [3, 4]")


def test_inv_freq_of_3_rows_in_an_extract(client: TestClient) -> None:
    paired = client.post("/v1/audit", content=extract(inv_freq=array([2, 4], 8)))
    assert paired.status_code == 200, paired.text[:300]
    three = client.post("/v1/audit", content=extract(inv_freq=array([3, 4], 12)))
    assert three.status_code == 400, three.text[:300]
    refused(three, f"extract: inv_freq {PAIR_OR_VECTOR} [3, 4]")


# --- the property: every hostile value in every numeric field ---------------------------------------------------

HOSTILE = [float("nan"), float("inf"), float("-inf"), HUGE, -HUGE, -1, 0, -0.0, 1.5, 2**32, 2**63, 2**64 - 1,
           1e308, -1e308, True, "7", None]
hostile = st.sampled_from(HOSTILE)
CONFIG_FIELDS = ["rope_theta", "partial_rotary_factor", "hidden_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "max_position_embeddings", "original_max_position_embeddings",
                 "rope_scaling.factor", "rope_scaling.low_freq_factor", "rope_scaling.high_freq_factor",
                 "rope_scaling.original_max_position_embeddings"]
EXTRACT_FIELDS = ["context_length", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "rotary_dim",
                  "rope_theta", "theta_swa", "attention_factor", "scaling.factor", "scaling.beta_fast",
                  "scaling.original_max_position_embeddings", "sections", "learned_positions", "inv_freq.shape",
                  "freq_factors.shape", "caches.cos.shape"]
GGUF_KEYS = ["context_length", "embedding_length", "attention.head_count", "attention.head_count_kv",
             "attention.key_length", "rope.dimension_count", "rope.freq_base", "rope.freq_base_swa",
             "rope.scaling.factor", "rope.scale_linear", "rope.scaling.attn_factor",
             "rope.scaling.original_context_length", "rope.scaling.yarn_beta_fast", "rope.dimension_sections"]
SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


# fields a message may name instead: the value derived from them (head_dim = hidden_size // num_attention_heads)
DERIVED = {"hidden_size": "head_dim", "num_attention_heads": "head_dim"}


def _named(response: Any, field: str) -> None:
    """Never a 500; a 4xx names the field (its last part: a config's `rope_scaling.factor` is `factor`), or the
    value derived from it; a 413 (the table the values ask for is over the size bound) says how to ask for less."""
    assert response.status_code < 500, (field, response.status_code, response.text[:300])
    if 400 <= response.status_code != 413:
        leaf = field.split(".")[-1]
        message = response.json()["error"]
        assert leaf in message or DERIVED.get(leaf, leaf) in message, (field, response.text[:300])


def _config_with(field: str, value: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(SMALL_LLAMA3))
    *path, leaf = field.split(".")
    (out[path[0]] if path else out)[leaf] = value
    return out


@SETTINGS
@given(field=st.sampled_from(CONFIG_FIELDS), value=hostile)
def test_config_fields_never_a_500(client: TestClient, field: str, value: Any) -> None:
    text = json.dumps(_config_with(field, value))
    _named(client.post("/v1/audit", content=text), field)
    _named(client.post("/v1/audit", params={"config": text}, content=gguf(LLAMA)), field)
    _named(client.post("/v1/rope/from-config", params={"max_position": 4}, content=text,
                       headers={"content-type": "application/json"}), field)


def _extract_with(field: str, value: Any) -> bytes:
    if field.endswith(".shape"):
        name = field.removesuffix(".shape")
        entry = array([value] if value is not None else value)
        if name == "caches.cos":
            return extract(caches={"cos": entry, "sin": array([2, 2])})
        return extract(**{name: entry})
    if field.startswith("scaling."):
        return extract(scaling={"rope_type": "yarn", "factor": 4.0, field.removeprefix("scaling."): value})
    if field in ("sections", "learned_positions"):
        return extract(**{field: [value, 4]})
    return extract(**{field: value})


@SETTINGS
@given(field=st.sampled_from(EXTRACT_FIELDS), value=hostile)
def test_extract_fields_never_a_500(client: TestClient, field: str, value: Any) -> None:
    _named(client.post("/v1/audit", content=_extract_with(field, value)), field)


def _gguf_value(value: Any) -> tuple[str, Any] | None:
    """The GGUF type that holds `value` (None: no GGUF scalar can)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return None
    if isinstance(value, float):
        return "f64", value
    if -(2**63) <= value < 2**63:
        return "i64", value
    return ("u64", value) if 0 <= value < 2**64 else None


@SETTINGS
@given(key=st.sampled_from(GGUF_KEYS), value=hostile)
def test_gguf_keys_never_a_500(client: TestClient, key: str, value: Any) -> None:
    typed = _gguf_value(value)
    if typed is None:
        return
    kind, number = typed
    entry = (kind, [number, 16, 24, 0]) if key == "rope.dimension_sections" else typed
    _named(client.post("/v1/audit", content=gguf({**LLAMA, key: entry})), key)


@SETTINGS
@given(dims=st.lists(hostile, min_size=1, max_size=3))
def test_safetensors_shapes_never_a_500(client: TestClient, dims: list[Any]) -> None:
    entry = json.dumps({"dtype": "F32", "shape": dims, "data_offsets": [0, 16]}).encode()
    _named(client.post("/v1/audit", content=safetensors(entry)), "shape")
    learned = json.dumps({"model.wpe.weight": {"dtype": "F32", "shape": dims, "data_offsets": [0, 16]}}).encode()
    _named(client.post("/v1/audit", content=struct.pack("<Q", len(learned)) + learned + bytes(16)), "shape")
