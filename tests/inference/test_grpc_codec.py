"""The gRPC messages to the service's request types and back, the status of each error, and the protocol groups of
the gRPC methods (no server: the codec and the servicer's checks alone)."""

from __future__ import annotations

import grpc
import ml_dtypes
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from posenc.models.dtypes import DTYPES, DType
from posenc.service.errors import (
    GRPC_DETAILS_BYTES,
    BadRequest,
    Forbidden,
    InsufficientStorage,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    Unavailable,
)
from posenc.service.grpc.server import inference_handler
from posenc.service.grpc.servicer import Servicer, grpc_failure, grpc_status
from posenc.service.inference.codecs import protobuf
from posenc.service.inference.codecs.protobuf import (
    CONTENTS_FIELD,
    decode_infer_request,
    encode_infer_response,
    split_infer_request,
)
from posenc.service.inference.dataplane import DataPlane
from posenc.service.request_kit.restricted import GROUP_ROUTES, METHOD_GROUPS
from posenc.service.settings import RESTRICTED_API_GROUPS, Settings


def _values(dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "b":
        return np.array([[True, False, True], [False, False, True]])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, 0, 1], [2, 3, info.max]], dtype)
    return np.array([[-1.5, 0.0, 0.25], [3.0, 1e3, -7.75]]).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.kserve)
def test_every_datatype_raw_and_typed(dtype: DType) -> None:
    """Every datatype HTTP takes arrives as the same array from raw bytes and (where Triton defines a field) from
    typed contents; FP16 and BF16 only raw."""
    array = _values(dtype.numpy)
    raw = pb.ModelInferRequest(model_name="m")
    raw.inputs.add(name="x", datatype=dtype.kserve, shape=array.shape)
    raw.raw_input_contents.append(array.tobytes())
    parsed, _ = decode_infer_request(raw, None)
    assert parsed.inputs[0].array.dtype == dtype.numpy
    np.testing.assert_array_equal(parsed.inputs[0].array, array)
    typed = pb.ModelInferRequest(model_name="m")
    tensor = typed.inputs.add(name="x", datatype=dtype.kserve, shape=array.shape)
    field = CONTENTS_FIELD.get(dtype.kserve)
    if field is None:
        assert dtype.kserve in ("FP16", "BF16")
        tensor.contents.fp32_contents.extend(array.astype(np.float32).reshape(-1).tolist())
        with pytest.raises(BadRequest, match="has no typed contents; send its bytes in raw_input_contents"):
            decode_infer_request(typed, None)
        return
    getattr(tensor.contents, field).extend(array.reshape(-1).tolist())
    parsed, _ = decode_infer_request(typed, None)
    np.testing.assert_array_equal(parsed.inputs[0].array, array)
    assert parsed.inputs[0].array.dtype == dtype.numpy


def test_bfloat16_raw_is_exact() -> None:
    array = np.array([1.0, -2.5, 3.140625], ml_dtypes.bfloat16)
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="BF16", shape=[3])
    request.raw_input_contents.append(array.tobytes())
    parsed, _ = decode_infer_request(request, None)
    assert parsed.inputs[0].array.tobytes() == array.tobytes()


@pytest.mark.parametrize("values", [[1, 300], [-200, 1], [-129, 127]], ids=["above", "below", "just-below"])
def test_values_out_of_range_use_the_http_message(values: list[int]) -> None:
    """Typed contents outside the datatype's range, on either side (int_contents carries 32 bits: INT8 is checked)."""
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="INT8", shape=[2]).contents.int_contents.extend(values)
    with pytest.raises(BadRequest, match=r"^input 'x': 'data' has values outside the INT8 range$"):
        decode_infer_request(request, None)


@pytest.mark.parametrize("typed", [False, True], ids=["raw_input_contents", "contents"])
def test_rank_over_64_is_refused_before_the_buffer(typed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape of 65 dimensions (numpy holds 64 at most: it was INTERNAL) is a 400 naming the limit, raised
    before the inputs' buffer is allocated, from raw bytes and from typed contents alike (as the wire gives them)."""
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, *[1] * 64])
    if typed:
        tensor.contents.fp32_contents.extend([1.0, 2.0])
    else:
        request.raw_input_contents.append(np.array([1.0, 2.0], np.float32).tobytes())
    message, raw = split_infer_request(request.SerializeToString())

    def no_buffer(chunks: object) -> None:
        raise AssertionError("the inputs' buffer was allocated")

    monkeypatch.setattr(protobuf, "aligned_join", no_buffer)
    with pytest.raises(BadRequest, match=r"^input 'x': shape has rank 65; at most 64 dimensions are supported$"):
        decode_infer_request(message, None, raw)


def test_binary_data_size_must_agree_with_the_raw_bytes_and_outputs_are_raw() -> None:
    """KServe's client sends binary_data_size beside raw_input_contents: taken when it agrees, a 400 when it
    lies or names bytes that are not there."""
    request = pb.ModelInferRequest(model_name="m", id="r1")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.parameters["binary_data_size"].int64_param = 4
    request.raw_input_contents.append(b"\0\0\0\0")
    parsed, _ = decode_infer_request(request, None)
    assert parsed.inputs[0].array.tolist() == [0.0]
    tensor.parameters["binary_data_size"].int64_param = 8
    with pytest.raises(BadRequest, match=r"^input 'x': binary_data_size is 8, raw_input_contents\[0\] has 4 bytes$"):
        decode_infer_request(request, None)
    tensor.parameters["binary_data_size"].bool_param = True
    with pytest.raises(BadRequest, match="binary_data_size is True"):
        decode_infer_request(request, None)
    typed = pb.ModelInferRequest(model_name="m")
    entry = typed.inputs.add(name="x", datatype="FP32", shape=[1])
    entry.contents.fp32_contents.append(1.0)
    entry.parameters["binary_data_size"].int64_param = 4
    with pytest.raises(BadRequest, match="binary_data_size is given, but the input has no raw_input_contents entry"):
        decode_infer_request(typed, None)
    del request.inputs[0].parameters["binary_data_size"]
    request.outputs.add(name="y")
    parsed, _ = decode_infer_request(request, None)
    assert parsed.outputs is not None and parsed.outputs[0].binary
    response = pb.ModelInferResponse.FromString(
        encode_infer_response("m", "1", parsed, {"y": np.arange(3, dtype=np.float32)}, ["y"]))
    assert response.id == "r1" and response.outputs[0].datatype == "FP32" and list(response.outputs[0].shape) == [3]
    assert response.raw_output_contents[0] == np.arange(3, dtype=np.float32).tobytes()


@pytest.mark.parametrize("entries", [1, 3])
def test_raw_entries_are_one_per_input_outside_shared_memory(entries: int) -> None:
    """Two inputs outside shared memory take exactly two raw entries: fewer or more (an entry nothing reads) is a
    400 naming both counts."""
    request = pb.ModelInferRequest(model_name="m")
    for name in ("x", "y"):
        request.inputs.add(name=name, datatype="FP32", shape=[1])
    shm = request.inputs.add(name="z", datatype="FP32", shape=[1])
    shm.parameters["shared_memory_region"].string_param = "region"
    request.raw_input_contents.extend([b"\0\0\0\0"] * entries)
    with pytest.raises(BadRequest, match=rf"^raw_input_contents has {entries} entries; the request has 2 inputs "
                                         "outside shared memory, one entry each in input order$"):
        decode_infer_request(request, None)


def test_response_bytes_are_protobufs_own_encoding() -> None:
    """The response assembled around the outputs' buffers is the message protobuf would build, with an empty raw
    entry for an output in shared memory and lengths that take several varint bytes."""
    from posenc.service.inference.codecs.kserve_request import InferRequest, RequestedOutput
    from posenc.service.inference.shared_memory.refs import ShmRef

    outputs = {"a": np.arange(40_000, dtype=np.float32).reshape(200, 200), "b": np.ones((2, 3), np.int64),
               "c": np.zeros(0, np.float16)}
    request = InferRequest("id-7", [], [RequestedOutput("a", True), RequestedOutput("b", True, ShmRef("r", 8, 48)),
                                        RequestedOutput("c", True)], True)
    ours = encode_infer_response("m", "1", request, outputs, ["a", "b", "c"])
    expected = pb.ModelInferResponse(model_name="m", model_version="1", id="id-7")
    expected.outputs.add(name="a", datatype="FP32", shape=[200, 200])
    shm = expected.outputs.add(name="b", datatype="INT64", shape=[2, 3])
    shm.parameters["shared_memory_region"].string_param = "r"
    shm.parameters["shared_memory_byte_size"].int64_param = 48
    shm.parameters["shared_memory_offset"].int64_param = 8
    expected.outputs.add(name="c", datatype="FP16", shape=[0])
    expected.raw_output_contents.extend([outputs["a"].tobytes(), b"", b""])
    assert pb.ModelInferResponse.FromString(ours) == expected


@pytest.mark.parametrize(("error", "code", "retry"), [
    (BadRequest("x"), grpc.StatusCode.INVALID_ARGUMENT, None),
    (Forbidden("x"), grpc.StatusCode.PERMISSION_DENIED, None),
    (NotFound("x"), grpc.StatusCode.NOT_FOUND, None),
    (PayloadTooLarge("x"), grpc.StatusCode.RESOURCE_EXHAUSTED, None),
    (InsufficientStorage("x"), grpc.StatusCode.RESOURCE_EXHAUSTED, None),
    (Unavailable("x", retry_after=1, overloaded=True), grpc.StatusCode.RESOURCE_EXHAUSTED, "1"),
    (Unavailable("x", retry_after=5), grpc.StatusCode.UNAVAILABLE, "5"),
    (Unavailable("x"), grpc.StatusCode.UNAVAILABLE, None),
    (ServiceError("x"), grpc.StatusCode.INTERNAL, None),
])
def test_status_of_each_error(error: ServiceError, code: grpc.StatusCode, retry: str | None) -> None:
    status, trailing = grpc_status(error)
    assert status == code and dict(trailing).get("retry-after") == retry


@pytest.mark.parametrize("text", ["a" * 10_000, "é%" * 5_000, "\U0001f600" * 5_000, "short"])
def test_a_status_message_fits_the_limit_on_the_wire(text: str) -> None:
    """Cut by its percent-encoded size (what the client's metadata limit counts), with the count left out."""
    status, details, _ = grpc_failure(BadRequest(text))
    wire = "".join(c if " " <= c <= "~" and c != "%" else "".join(f"%{b:02X}" for b in c.encode()) for c in details)
    assert status == grpc.StatusCode.INVALID_ARGUMENT and len(wire) <= GRPC_DETAILS_BYTES
    if text == "short":
        assert details == text
    else:
        kept = details.rsplit("… (", 1)[0]
        assert text.startswith(kept) and len(wire) > GRPC_DETAILS_BYTES - 100
        assert details.endswith(f"… ({len(text) - len(kept)} more characters)")


def test_every_served_method_has_a_protocol_group() -> None:
    served = set(METHOD_GROUPS)
    assert set(METHOD_GROUPS.values()) <= set(RESTRICTED_API_GROUPS) and set(GROUP_ROUTES) == set(RESTRICTED_API_GROUPS)
    names = {m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods}
    assert served <= names
    plane = DataPlane(None, Settings(), None, None, problems=[])  # type: ignore[arg-type]
    handler = inference_handler(Servicer(plane, lambda *args: None))
    call = type("Details", (), {"method": "/inference.GRPCInferenceService/ModelInfer", "invocation_metadata": ()})
    assert handler.service(call()) is not None


def test_restricted_methods_need_their_header_as_metadata() -> None:
    settings = Settings(restricted_api="inference:x-infer-key=s3cret;shared-memory:x-shm=k")
    servicer = Servicer(DataPlane(None, settings, None, None), lambda *args: None)  # type: ignore[arg-type]
    with pytest.raises(Forbidden) as refused:
        servicer.caller("ModelStreamInfer", {"x-infer-key": "wrong"})
    assert refused.value.message == (
        "/inference.GRPCInferenceService/ModelStreamInfer is in the restricted protocol group 'inference': send the "
        "header 'x-infer-key' with the value this server is configured with (POSENC_RESTRICTED_API)")
    assert "s3cret" not in refused.value.message
    assert not servicer.caller("ModelInfer", {"x-infer-key": "s3cret"}).has_key
    assert servicer.caller("ServerLive", {"x-shm": "k"}).has_key
    assert servicer.caller("ServerLive", {}).peer is None


def test_raw_inputs_land_in_one_aligned_buffer() -> None:
    """Raw inputs are joined once into a buffer that starts on a 64-byte boundary (as HTTP bodies are read), and
    each input is a view of it, not a copy."""
    arrays = [np.arange(6, dtype=np.float32), np.arange(3, dtype=np.int64)]  # 24 bytes: the INT64 stays aligned
    request = pb.ModelInferRequest(model_name="m")
    for index, array in enumerate(arrays):
        request.inputs.add(name=f"x{index}", datatype="FP32" if array.dtype == np.float32 else "INT64",
                           shape=array.shape)
        request.raw_input_contents.append(array.tobytes())
    parsed, body = decode_infer_request(request, None)
    base = np.frombuffer(body, np.uint8)
    assert base.ctypes.data % 64 == 0 and len(body) == 24 + 24
    for tensor, array in zip(parsed.inputs, arrays, strict=True):
        np.testing.assert_array_equal(tensor.array, array)
        assert np.shares_memory(tensor.array, base)


def _full_request() -> pb.ModelInferRequest:
    """A request with every kind of top-level field, raw entries between them, and an entry of 200 bytes (a
    two-byte length)."""
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="r9")
    request.parameters["sequence_id"].int64_param = -3
    request.parameters["priority"].uint64_param = 2**40
    request.parameters["flag"].bool_param = True
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[50])
    tensor.parameters["binary_data_size"].int64_param = 200
    request.inputs.add(name="y", datatype="INT64", shape=[0])
    request.outputs.add(name="out").parameters["binary_data"].bool_param = True
    request.raw_input_contents.extend([np.arange(50, dtype=np.float32).tobytes(), b""])
    return request


def test_split_request_is_protobufs_message_with_raw_views() -> None:
    """The request read apart is the message protobuf reads, less its raw entries, which come back in order as
    views of the request's bytes (no copy), with unknown fields kept for protobuf."""
    request = _full_request()
    # unknown fields of every fixed width before a raw entry: a wrong skip would misread the entry after them
    unknown = bytes([14 << 3 | 1]) + bytes(range(8)) + bytes([13 << 3 | 5]) + bytes(range(4)) + bytes([15 << 3 | 0, 7])
    data = request.SerializeToString() + unknown + bytes([7 << 3 | 2, 3]) + b"abc"
    message, raw = split_infer_request(data)
    expected = pb.ModelInferRequest.FromString(data)
    assert [bytes(chunk) for chunk in raw] == list(expected.raw_input_contents)
    del expected.raw_input_contents[:]
    assert message == expected and not message.raw_input_contents
    base = np.frombuffer(data, np.uint8)
    assert all(np.shares_memory(np.frombuffer(chunk, np.uint8), base) for chunk in raw if len(chunk))
    parsed, _ = decode_infer_request(message, None, raw[:2])
    np.testing.assert_array_equal(parsed.inputs[0].array, np.arange(50, dtype=np.float32))


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x0a\x80", b"\x12\x05ab", b"\x3a\x05ab", b"\x3a",
                                  b"\x0b\x0c", b"\x08" + b"\xff" * 11, b"\x09abc",
                                  # a raw entry's length as a varint of 10 bytes (protobuf reads it) and 11 (it refuses)
                                  b"\x3a\x85" + b"\x80" * 8 + b"\x00abcde", b"\x3a\x85" + b"\x80" * 9 + b"\x00abcde"])
def test_split_of_a_malformed_request_fails_as_protobuf(data: bytes) -> None:
    """Bytes that are not a request fail as protobuf's own parse of them does (the walk gives up, protobuf reads
    the whole message)."""
    from google.protobuf.message import DecodeError

    try:
        expected = pb.ModelInferRequest.FromString(data)
    except DecodeError:
        with pytest.raises(DecodeError):
            split_infer_request(data)
        return
    message, raw = split_infer_request(data)
    assert [bytes(chunk) for chunk in raw] == list(expected.raw_input_contents)
    del expected.raw_input_contents[:]
    assert message == expected
