"""Byte-level details of the wire formats that the round-trip tests do not pin down.

- safetensors: the JSON header is space-padded to a multiple of 8 bytes (the format's rule, which keeps the
  tensor data aligned), whatever the header's own length;
- Accept: among media types of equal quality the first listed wins;
- KServe binary outputs: header entries and binary chunks in the same order (the model's output order by
  default, the request's order when outputs are named);
- KServe JSON integer data outside the datatype's range is a 400, never wrapped around.
"""

import json
import struct
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load

from posenc.service.codec.encode import encode_safetensors, negotiate_format
from posenc.service.errors import BadRequest
from posenc.service.inference.codecs.kserve_request import InferRequest, RequestedOutput, parse_infer_request
from posenc.service.inference.codecs.kserve_response import encode_infer_response
from posenc.service.testing import decode_response

# --- safetensors header padding -----------------------------------------------------------------------


def _header(body: bytes) -> tuple[int, bytes]:
    """(declared header length, header bytes) of a safetensors file."""
    (length,) = struct.unpack("<Q", body[:8])
    return length, body[8:8 + length]


def _check_padded(body: bytes) -> int:
    """Asserts the header rule; returns the header's length without its padding."""
    length, header = _header(body)
    assert length % 8 == 0, f"header length {length} is not a multiple of 8"
    stripped = header.rstrip(b" ")
    assert len(header) - len(stripped) < 8, "padding is more than needed"
    assert isinstance(json.loads(stripped), dict) and stripped.endswith(b"}")
    return len(stripped)


@pytest.mark.parametrize("metadata", [{}, {"k": "v"}, {"rope_type": "default", "x": "1" * 13}])
def test_safetensors_header_is_padded_to_8_bytes_for_every_length(metadata: dict[str, str]) -> None:
    """Guards against writing the header unpadded: names of 16 lengths give headers of every length mod 8."""
    residues = set()
    for extra in range(16):
        tensors = {"t" + "x" * extra: np.arange(3, dtype=np.float32), "b": np.ones((2, 2), dtype=np.int64)}
        body = encode_safetensors(tensors, metadata)
        residues.add(_check_padded(body) % 8)
        loaded = safetensors_load(body)
        for name, array in tensors.items():
            np.testing.assert_array_equal(loaded[name], array)
        length, _ = _header(body)
        assert len(body) == 8 + length + 3 * 4 + 4 * 8
    assert residues == set(range(8))


TABLE_URLS = [
    "/v1/sinusoidal?max_position=1&dim=4",
    "/v1/sinusoidal?max_position=123&dim=12&variant=fairseq",
    "/v1/rope?max_position=7&head_dim=8",
    "/v1/rope?max_position=1000&head_dim=64&rope_type=linear&factor=2.5",
    "/v1/alibi/slopes?num_heads=12",
    "/v1/alibi/bias?num_heads=3&query_length=5&key_length=17&mask=true",
    "/v1/t5/buckets?query_length=9&key_length=9",
    "/v1/deberta/buckets?query_length=2&key_length=3",
    "/v1/relative/clipped?query_length=10&key_length=100&max_relative_position=4",
]


def test_safetensors_headers_served_over_http_are_padded(client: TestClient) -> None:
    """The same rule on real responses, whose headers (metadata included) have assorted lengths."""
    unpadded = []
    for url in TABLE_URLS:
        r = client.get(url)
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-safetensors", url
        unpadded.append(_check_padded(r.content))
        assert safetensors_load(r.content)  # the reference reader accepts it
    assert any(n % 8 for n in unpadded), "no response needed padding: the check above proved nothing"


# --- Accept ties ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("accept", "expected"), [
    ("application/x-npy, application/json", "npy"),
    ("application/json, application/x-npy", "json"),
    ("application/x-npy;q=0.5, application/json;q=0.5", "npy"),
    ("application/json;q=0.5, application/x-npy;q=0.5", "json"),
    ("application/octet-stream, application/x-safetensors, application/json", "raw"),
    ("text/html, application/json;q=0.7, application/x-npy;q=0.7, application/x-safetensors;q=0.6", "json"),
])
def test_equal_quality_first_listed_wins(accept: str, expected: str) -> None:
    """Guards the tie-break of `negotiate_format`: equal q keeps the earlier media type."""
    assert negotiate_format(None, accept) == expected


@pytest.mark.parametrize(("accept", "media_type"), [
    ("application/x-npy, application/json", "application/x-npy"),
    ("application/json, application/x-npy", "application/json"),
    ("application/json;q=0.5, application/x-npy;q=0.5", "application/json"),
])
def test_equal_quality_first_listed_wins_over_http(client: TestClient, accept: str, media_type: str) -> None:
    r = client.get("/v1/sinusoidal?max_position=4&dim=4", headers={"Accept": accept})
    assert r.status_code == 200 and r.headers["content-type"] == media_type


# --- KServe binary output order --------------------------------------------------------------------------

# Two outputs whose name order (alpha < zeta) is not the model's order (zeta first); different dtypes and
# sizes, so a chunk read at the wrong place cannot decode to the right values.
OUTPUTS = {
    "alpha": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
    "zeta": np.array([-3, 1 << 40, 7, 0, 5], dtype=np.int64),
}
MODEL_ORDER = ["zeta", "alpha"]


def _decode(body: bytes, headers: dict[str, str]) -> tuple[list[str], dict[str, np.ndarray]]:
    """(output names in header order, arrays) of an infer response, binary chunks read in header order (the
    kit's decoder raises when they do not add up to the body)."""
    response = decode_response(body, headers)
    return [entry["name"] for entry in response.header["outputs"]], response.outputs


def _request(outputs: list[RequestedOutput] | None, binary_output: bool) -> InferRequest:
    return InferRequest(id="req-1", inputs=[], outputs=outputs, binary_output=binary_output)


@pytest.mark.parametrize("binary", [True, False])
def test_default_outputs_follow_the_model_order(binary: bool) -> None:
    """Guards against listing unrequested outputs by name instead of in the model's order."""
    body, headers = encode_infer_response("m", "1", _request(None, binary), OUTPUTS, MODEL_ORDER)
    names, arrays = _decode(body, headers)
    assert names == MODEL_ORDER
    for name, array in OUTPUTS.items():
        np.testing.assert_array_equal(arrays[name], array)
        assert arrays[name].dtype == array.dtype


@pytest.mark.parametrize("requested", [["alpha", "zeta"], ["zeta", "alpha"]])
@pytest.mark.parametrize("binary", [(True, True), (True, False), (False, True)], ids=["bb", "bj", "jb"])
def test_requested_outputs_keep_the_request_order(requested: list[str], binary: tuple[bool, bool]) -> None:
    """Guards against binary chunks written in another order than the header lists them (reversed, by name)."""
    outputs = [RequestedOutput(name, flag) for name, flag in zip(requested, binary, strict=True)]
    body, headers = encode_infer_response("m", "1", _request(outputs, False), OUTPUTS, MODEL_ORDER)
    names, arrays = _decode(body, headers)
    assert names == requested
    for name in requested:
        np.testing.assert_array_equal(arrays[name], OUTPUTS[name])
    head = json.loads(body[:int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])])
    assert head["id"] == "req-1" and head["model_name"] == "m" and head["model_version"] == "1"


def test_binary_chunks_are_laid_out_in_header_order() -> None:
    """The exact layout: header, then zeta's 40 bytes, then alpha's 24 bytes."""
    body, headers = encode_infer_response("m", "1", _request(None, True), OUTPUTS, MODEL_ORDER)
    length = int({k.lower(): v for k, v in headers.items()}["inference-header-content-length"])
    assert body[length:] == OUTPUTS["zeta"].astype("<i8").tobytes() + OUTPUTS["alpha"].astype("<f4").tobytes()


# --- out-of-range JSON integers ---------------------------------------------------------------------------


def _json_request(datatype: str, data: list[Any]) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}]}).encode()


@pytest.mark.parametrize(("datatype", "data"), [
    ("INT8", [300]), ("INT8", [-129]), ("UINT8", [-1]), ("UINT8", [256]), ("INT16", [40000]),
    ("UINT16", [65536]), ("INT32", [2**31]), ("INT32", [-(2**31) - 1]), ("UINT32", [2**32]), ("UINT32", [-5]),
    ("INT64", [2**63]), ("INT64", [2**63, 2**64 - 1]), ("UINT64", [-1]), ("UINT64", [-1, -2]),
    ("INT64", [1, 2**63 + 5]), ("UINT64", [1, 2**70]), ("UINT64", [-1, 2**64 - 1]),
])
def test_out_of_range_integers_are_a_400(datatype: str, data: list[int]) -> None:
    """Guards the range check of JSON integer data: without it numpy wraps 300 to 44 as INT8."""
    with pytest.raises(BadRequest, match="range"):
        parse_infer_request(_json_request(datatype, data), None)


@pytest.mark.parametrize(("datatype", "data"), [
    ("INT8", [-128, 127]), ("UINT8", [0, 255]), ("INT16", [-(2**15), 2**15 - 1]), ("UINT16", [0, 2**16 - 1]),
    ("INT32", [-(2**31), 2**31 - 1]), ("UINT32", [0, 2**32 - 1]), ("INT64", [-(2**63), 2**63 - 1]),
    ("UINT64", [2**63, 2**64 - 1]), ("UINT64", [0, 2**64 - 1]), ("UINT64", [5, 2**63]),
])
def test_integers_at_the_range_limits_are_kept_exactly(datatype: str, data: list[int]) -> None:
    (tensor,) = parse_infer_request(_json_request(datatype, data), None).inputs
    assert tensor.array.tolist() == data


def test_out_of_range_position_ids_over_http_are_a_400(client: TestClient) -> None:
    """position_ids INT64 data of 2**63 (fits uint64 only): 400 naming the range, not a wrapped negative position."""
    rng = np.random.default_rng(0)
    tensors = [{"name": name, "datatype": "FP32", "shape": [1, 8, 1, 64],
                "data": rng.standard_normal(512).astype(np.float32).tolist()} for name in ("query", "key", "value")]
    tensors.append({"name": "position_ids", "datatype": "INT64", "shape": [1, 1], "data": [[2**63]]})
    r = client.post("/v2/models/rope_attention/infer", content=json.dumps({"inputs": tensors}).encode())
    assert r.status_code == 400, r.text
    body = r.json()
    assert set(body) == {"error", "type"} and body["type"] == "bad_request"
    assert "position_ids" in body["error"] and "INT64" in body["error"] and "range" in body["error"]
