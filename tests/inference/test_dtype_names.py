"""Every dtype's KServe v2 name is the protocol's: the table in models/dtypes.py against the spec's list and
tritonclient's own mapping, and every dtype through an infer request (JSON and binary) of an Identity model.

The request bodies and the model's config.json spell datatypes as the spec does (`KSERVE_V2`), never through
models/dtypes.py, so a misspelt name there fails here: clients would have to send it and would get it back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
from fastapi.testclient import TestClient
from tritonclient.utils import np_to_triton_dtype

from posenc.models.dtypes import DTYPES
from tests.conftest import running_client

# Open Inference Protocol (KServe v2) tensor data types, "Tensor Data Types" table; BYTES is not served here.
KSERVE_V2 = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
             "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
             "float32": "FP32", "float64": "FP64", "bfloat16": "BF16"}
SPEC_NAMES = {*KSERVE_V2.values(), "BYTES"}
# ONNX TensorProto.DataType of each, for the hand-built Identity models below
ONNX_ELEM_TYPE = {"float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "bool": 9,
                  "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "bfloat16": 16}
HEADER_LENGTH = "Inference-Header-Content-Length"


def test_every_dtype_has_the_kserve_v2_name() -> None:
    assert {d.name: d.kserve for d in DTYPES} == KSERVE_V2
    assert {d.kserve for d in DTYPES} <= SPEC_NAMES
    assert {d.name: np_to_triton_dtype(d.numpy) for d in DTYPES} == KSERVE_V2  # tritonclient agrees
    assert {d.name: d.triton for d in DTYPES} == {name: f"TYPE_{kserve}" for name, kserve in KSERVE_V2.items()}


# ------------------------------------------------------------------------- through an infer request


def _field(number: int, value: int | str | bytes) -> bytes:
    """One protobuf field: an integer as a varint (wire type 0), a string or message as bytes (wire type 2)."""
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def identity_onnx(elem_type: int) -> bytes:
    """An ONNX model y = Identity(x), x and y [batch, 3] of ONNX type `elem_type` (opset 19), as onnx.proto
    serialises it: ModelProto{ir_version 1, graph 7, opset_import 8}, GraphProto{node 1, name 2, input 11,
    output 12}, NodeProto{input 1, output 2, op_type 4}, ValueInfoProto{name 1, type 2},
    TypeProto{tensor_type 1}, Tensor{elem_type 1, shape 2}, TensorShapeProto{dim 1}, Dimension{dim_value 1,
    dim_param 2}."""
    shape = _field(1, _field(2, "batch")) + _field(1, _field(1, 3))
    tensor_type = _field(1, _field(1, elem_type) + _field(2, shape))

    def value_info(name: str) -> bytes:
        return _field(1, name) + _field(2, tensor_type)

    node = _field(1, "x") + _field(2, "y") + _field(4, "Identity")
    graph = _field(1, node) + _field(2, "identity") + _field(11, value_info("x")) + _field(12, value_info("y"))
    return _field(1, 9) + _field(7, graph) + _field(8, _field(2, 19))


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A repository of one Identity model per dtype, `identity_<dtype>`, its config.json in the spec's names."""
    repository = tmp_path_factory.mktemp("identity")
    for name, kserve in KSERVE_V2.items():
        folder = repository / f"identity_{name}"
        folder.mkdir()
        (folder / "model.onnx").write_bytes(identity_onnx(ONNX_ELEM_TYPE[name]))
        tensor = {"datatype": kserve, "shape": [-1, 3]}
        config = {"inputs": [{"name": "x", **tensor}], "outputs": [{"name": "y", **tensor}], "max_batch_size": 4}
        (folder / "config.json").write_text(json.dumps(config))
    with running_client(model_repository=repository, providers="cpu") as c:
        yield c


def values(name: str) -> np.ndarray:
    """[2, 3] of dtype `name`: integers at both ends of their range, floats exact in every float dtype."""
    dtype = ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)
    if name == "bool":
        return np.array([[True, False, True], [False, False, True]])
    if name.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dtype)
    return np.array([[0.5, -2.25, 3.0], [1024.0, -0.125, 7.0]], dtype=dtype)


# bfloat16 included: onnxruntime's Python binding takes no ml_dtypes.bfloat16 array, so the engine binds its
# bit patterns (a BF16 model's every request was a 500 before).
ROUND_TRIPS = sorted(KSERVE_V2)


def _ready(client: TestClient, name: str) -> None:
    r = client.get(f"/v2/models/identity_{name}/ready")
    assert r.status_code == 200, client.get("/v2/models/identity_" + name).text


@pytest.mark.parametrize("name", ROUND_TRIPS)
def test_every_dtype_round_trips_as_binary(client: TestClient, name: str) -> None:
    """tritonclient builds the request and reads the answer: its names are the spec's."""
    _ready(client, name)
    array = values(name)
    tensor = httpclient.InferInput("x", list(array.shape), KSERVE_V2[name])
    tensor.set_data_from_numpy(array, binary_data=True)
    output = httpclient.InferRequestedOutput("y", binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor], outputs=[output])
    r = client.post(f"/v2/models/identity_{name}/infer", content=body, headers={HEADER_LENGTH: str(header_length)})
    assert r.status_code == 200, r.text
    result = httpclient.InferenceServerClient.parse_response_body(
        r.content, header_length=int(r.headers[HEADER_LENGTH]))
    assert result.get_output("y")["datatype"] == KSERVE_V2[name]
    answer = result.as_numpy("y")
    assert answer is not None and answer.dtype == array.dtype
    np.testing.assert_array_equal(answer, array)


@pytest.mark.parametrize("name", ROUND_TRIPS)
def test_every_dtype_round_trips_as_json(client: TestClient, name: str) -> None:
    _ready(client, name)
    array = values(name)
    data = array.astype(np.float64).tolist() if name in ("float16", "bfloat16") else array.tolist()
    request = {"inputs": [{"name": "x", "datatype": KSERVE_V2[name], "shape": list(array.shape), "data": data}],
               "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}
    r = client.post(f"/v2/models/identity_{name}/infer", json=request)
    assert r.status_code == 200, r.text
    (output,) = r.json()["outputs"]
    assert (output["name"], output["datatype"], output["shape"]) == ("y", KSERVE_V2[name], list(array.shape))
    np.testing.assert_array_equal(np.array(output["data"], dtype=array.dtype).reshape(array.shape), array)


def test_the_identity_models_answer_as_repository_models(client: TestClient) -> None:
    index = client.post("/v2/repository/index").json()
    assert sorted(entry["name"] for entry in index) == sorted(f"identity_{name}" for name in KSERVE_V2)
    assert all(entry["state"] == "READY" for entry in index), index

