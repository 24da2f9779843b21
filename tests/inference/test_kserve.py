"""KServe v2 request parsing and response building (no model involved)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from posenc.service.errors import BadRequest
from posenc.service.inference.codecs.kserve_request import InferRequest, RequestedOutput, parse_infer_request
from posenc.service.inference.codecs.kserve_response import encode_infer_response
from posenc.service.testing import request_with_header


def _binary_body(header: dict, *arrays: np.ndarray, extra: bytes = b"") -> tuple[bytes, str]:
    request = request_with_header(header, arrays)
    return request.body + extra, str(request.header_length)


def _tensor(name: str, array: np.ndarray, datatype: str = "FP32", binary: bool = True) -> dict:
    entry: dict = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if binary:
        entry["parameters"] = {"binary_data_size": array.nbytes}
    else:
        entry["data"] = array.ravel().tolist()
    return entry


def test_json_and_binary_inputs_decode_to_the_same_arrays() -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7
    p = np.arange(6, dtype=np.int64).reshape(2, 3)
    json_req = parse_infer_request(json.dumps({"id": "r1", "inputs": [
        _tensor("a", a, binary=False), {"name": "p", "datatype": "INT64", "shape": [2, 3], "data": p.tolist()},
    ]}).encode(), None)
    body, length = _binary_body({"inputs": [_tensor("a", a), _tensor("p", p, "INT64")]}, a, p)
    bin_req = parse_infer_request(body, length)
    assert json_req.id == "r1" and bin_req.id is None
    for req in (json_req, bin_req):
        np.testing.assert_array_equal(req.inputs[0].array, a)
        np.testing.assert_array_equal(req.inputs[1].array, p)
        assert req.inputs[1].array.dtype == np.int64 and req.outputs is None


def test_unaligned_binary_data_is_realigned() -> None:
    a = np.arange(8, dtype=np.float32)
    header = {"inputs": [_tensor("a", a)], "id": "x"}  # header length is odd: bytes land unaligned
    head = json.dumps(header).encode()
    head = head if len(head) % 4 else head + b" "
    req = parse_infer_request(head + a.tobytes(), str(len(head)))
    assert req.inputs[0].array.flags.aligned
    np.testing.assert_array_equal(req.inputs[0].array, a)


def test_outputs_and_binary_flags() -> None:
    a = np.zeros((1, 2), dtype=np.float32)
    req = parse_infer_request(json.dumps({
        "inputs": [_tensor("a", a, binary=False)], "parameters": {"binary_data_output": True},
        "outputs": [{"name": "x"}, {"name": "y", "parameters": {"binary_data": False}}],
    }).encode(), None)
    assert req.binary_output and req.outputs == [RequestedOutput("x", True), RequestedOutput("y", False)]


A = np.zeros((2, 2), dtype=np.float32)
CASES = [
    (b"", None, "empty request body"),
    (b"{not json", None, "not valid JSON"),
    (b"[]", None, "JSON object"),
    (json.dumps({"inputs": []}).encode(), None, "non-empty list"),
    (json.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2, 2]}]}).encode(), None,
     "no 'data' and no binary_data_size"),
    (json.dumps({"inputs": [{"name": "a", "datatype": "FP99", "shape": [1], "data": [1]}]}).encode(), None,
     "datatype 'FP99' is not supported"),
    (json.dumps({"inputs": [{"name": "a", "datatype": ["FP32"], "shape": [1], "data": [1]}]}).encode(), None,
     "datatype ['FP32'] is not supported"),
    (json.dumps({"inputs": [{"name": "a", "datatype": {"t": 1}, "shape": [1], "data": [1]}]}).encode(), None,
     "datatype {'t': 1} is not supported"),
    (json.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2, -1], "data": [1]}]}).encode(), None,
     "non-negative integers"),
    (json.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}]}).encode(), None,
     "has 3 elements, shape [2, 2] needs 4"),
    (json.dumps({"inputs": [{"name": "a", "datatype": "INT64", "shape": [2], "data": [1.5, 2]}]}).encode(), None,
     "not valid for INT64"),
    (json.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2], "data": ["x", "y"]}]}).encode(), None,
     "not valid for FP32"),
    (json.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3]]}]}).encode(),
     None, "ragged"),
    (json.dumps({"inputs": [_tensor("a", A, binary=False), _tensor("a", A, binary=False)]}).encode(), None,
     "duplicate input names"),
    (json.dumps({"inputs": [_tensor("a", A, binary=False)], "id": 5}).encode(), None, "'id' must be a string"),
    (json.dumps({"inputs": [_tensor("a", A, binary=False)], "outputs": [{"name": "o",
     "parameters": {"classification": 2}}]}).encode(), None, "classification"),
    (json.dumps({"inputs": [_tensor("a", A, binary=False)], "parameters": {"binary_data_output": "yes"}}).encode(),
     None, "must be true or false"),
    (json.dumps({"inputs": [_tensor("a", A, binary=False), 5]}).encode(), None, "inputs[1] must be an object"),
    (json.dumps({"inputs": [_tensor("a", A, binary=False)], "outputs": 5}).encode(), None,
     "'outputs' must be a list"),
    (json.dumps({"inputs": [_tensor("a", A, binary=False)], "outputs": [{"name": "o"}, {"name": "o"}]}).encode(),
     None, "duplicate output names in ['o', 'o']"),
    (json.dumps({"inputs": [_tensor("a", A, binary=False)], "outputs": [{"name": "o", "datatype": "FP32"}]}).encode(),
     None, "output 'o': unknown keys ['datatype']"),
    *[(json.dumps({"inputs": [{**_tensor("a", A), "parameters": {"binary_data_size": size}}]}).encode(), None,
       f"binary_data_size must be a non-negative integer (got {size!r})") for size in ("16", 16.0, True, -1)],
]


@pytest.mark.parametrize(("body", "length", "message"), CASES, ids=[c[2] for c in CASES])
def test_malformed_json_requests_are_400(body: bytes, length: str | None, message: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(message)):
        parse_infer_request(body, length)


def test_both_data_and_binary_is_400() -> None:
    entry = {**_tensor("a", A), "data": A.ravel().tolist()}
    body, length = _binary_body({"inputs": [entry]}, A)
    with pytest.raises(BadRequest, match="both 'data' and binary_data_size"):
        parse_infer_request(body, length)


def test_trailing_and_missing_bytes_are_400() -> None:
    body, length = _binary_body({"inputs": [_tensor("a", A)]}, A, extra=b"\0\0\0\0")
    with pytest.raises(BadRequest, match="trailing bytes: the body has 20 bytes of binary data, inputs declare 16"):
        parse_infer_request(body, length)
    body, length = _binary_body({"inputs": [_tensor("a", A)]}, A)
    with pytest.raises(BadRequest, match="binary data is missing: inputs declare 16 bytes, the body has 12"):
        parse_infer_request(body[:-4], length)
    # binary_data_size declared but no header length: the whole body is JSON, nothing follows it.
    with pytest.raises(BadRequest, match="binary data is missing"):
        parse_infer_request(json.dumps({"inputs": [_tensor("a", A)]}).encode(), None)


def test_byte_count_must_match_shape() -> None:
    entry = _tensor("a", A)
    entry["parameters"]["binary_data_size"] = 12
    body, length = _binary_body({"inputs": [entry]}, A[:, :1], np.zeros(1, np.float32))
    with pytest.raises(BadRequest, match=r"binary_data_size is 12 bytes, shape \[2, 2\] FP32 needs 16"):
        parse_infer_request(body, length)


@pytest.mark.parametrize("length", ["abc", "0", "-3", "100000"])
def test_bad_header_length_is_400(length: str) -> None:
    body, _ = _binary_body({"inputs": [_tensor("a", A)]}, A)
    with pytest.raises(BadRequest, match="Inference-Header-Content-Length"):
        parse_infer_request(body, length)


def test_response_json_and_binary() -> None:
    out = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    req = InferRequest("id7", [], None, binary_output=False)
    body, headers = encode_infer_response("m", "1", req, {"output": out}, ["output"])
    decoded = json.loads(body)
    assert headers["Content-Type"] == "application/json" and decoded["id"] == "id7"
    assert decoded["outputs"][0] == {"name": "output", "datatype": "FP32", "shape": [1, 2, 3],
                                     "data": out.ravel().tolist()}
    req = InferRequest(None, [], None, binary_output=True)
    body, headers = encode_infer_response("m", "1", req, {"output": out[:, :, 1:]}, ["output"])
    length = int(headers["Inference-Header-Content-Length"])
    head = json.loads(body[:length])
    assert "id" not in head and head["outputs"][0]["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32).reshape(1, 2, 2), out[:, :, 1:])


class _Region:
    """A shared-memory source holding one array (the registry's lease, without a region)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def input_array(self, ref: object, dtype: np.dtype, shape: tuple[int, ...], where: str) -> np.ndarray:
        return self.array.view(dtype).reshape(shape)


@pytest.mark.parametrize("also", [{"data": A.ravel().tolist()}, {"parameters": {"binary_data_size": A.nbytes}}],
                         ids=["data", "binary_data_size"])
def test_shared_memory_with_data_of_another_kind_is_400(also: dict) -> None:
    shm = {"shared_memory_region": "r", "shared_memory_byte_size": A.nbytes}
    entry = {"name": "a", "datatype": "FP32", "shape": [2, 2], "parameters": shm}
    request = parse_infer_request(json.dumps({"inputs": [entry]}).encode(), None, _Region(A))
    np.testing.assert_array_equal(request.inputs[0].array, A)  # alone, the region is read
    parameters = {**shm, **also.get("parameters", {})}
    body = json.dumps({"inputs": [{**entry, **also, "parameters": parameters}]}).encode()
    binary = A.tobytes() if "parameters" in also else b""
    with pytest.raises(BadRequest, match="input 'a': shared-memory parameters and 'data' or binary_data_size"):
        parse_infer_request(body + binary, str(len(body)), _Region(A))


@pytest.mark.parametrize("key", ["shared_memory_byte_size", "shared_memory_offset"])
@pytest.mark.parametrize("value", ["16", 16.0, True, -1])
def test_shared_memory_sizes_are_non_negative_integers(key: str, value: object) -> None:
    shm = {"shared_memory_region": "r", "shared_memory_byte_size": A.nbytes, key: value}
    body = json.dumps({"inputs": [{"name": "a", "datatype": "FP32", "shape": [2, 2], "parameters": shm}]}).encode()
    message = f"parameter '{key}' must be a non-negative integer (got {value!r})"
    with pytest.raises(BadRequest, match=re.escape(message)):
        parse_infer_request(body, None, _Region(A))


def test_a_large_body_that_is_a_list_is_400() -> None:
    """A body large enough for its data lists to be lifted out of the JSON (kserve_json.lift_data) that is no
    JSON object: the generic parser's 400."""
    body = b'[{"name": "a", "datatype": "FP32", "shape": [300000], "data": [' + b"0.5," * 299_999 + b"0.5]}]"
    with pytest.raises(BadRequest, match="JSON object"):
        parse_infer_request(body, None)
