"""Property-based gRPC requests (hypothesis) against a live `posenc serve`: any `ModelInferRequest` (names,
datatypes, shapes, raw and typed contents, parameters, requested outputs) is answered OK or with a 4xx-like status
(INVALID_ARGUMENT, NOT_FOUND, ...), alone or in a stream: never INTERNAL or UNKNOWN, and the server stays up."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from posenc.service.testing import ServerProcess
from tests.onnx_models import grpc_infer_request, random_inputs

SERVICE = "/inference.GRPCInferenceService/"
DATATYPES = ["FP32", "FP16", "BF16", "FP64", "INT64", "INT32", "INT8", "UINT8", "UINT64", "BOOL", "BYTES", "FP8", ""]
NAMES = ["query", "key", "value", "position_ids", "output", "x", ""]
FIELDS = ["bool_contents", "int_contents", "int64_contents", "uint_contents", "uint64_contents", "fp32_contents",
          "fp64_contents", "bytes_contents"]
BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


@pytest.fixture(scope="module")
def channel() -> Iterator[grpc.Channel]:
    with ServerProcess({"log_level": "warning", "max_request_bytes": 1 << 20}, grpc=True) as server, \
            grpc.insecure_channel(server.grpc_address) as channel:
        yield channel


parameter_values = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=8),
                             st.floats(allow_nan=True), st.integers(0, 2**64 - 1))
parameter_keys = st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_byte_size",
                                  "shared_memory_offset", "binary_data", "binary_data_output", "classification", "k"])


def _set(target: pb.InferParameter, value: object) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if value >= 2**63:
            target.uint64_param = value
        else:
            target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


@st.composite
def requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=draw(st.sampled_from(["rope_attention", "rope_attention", "nope", ""])),
                                   model_version=draw(st.sampled_from(["", "", "1", "2"])),
                                   id=draw(st.text(max_size=10)))
    for key, value in draw(st.dictionaries(parameter_keys, parameter_values, max_size=2)).items():
        _set(request.parameters[key], value)
    for _ in range(draw(st.integers(0, 5))):
        tensor = request.inputs.add(name=draw(st.sampled_from(NAMES)), datatype=draw(st.sampled_from(DATATYPES)),
                                    shape=draw(st.lists(st.integers(-2, 6) | st.just(1 << 40), max_size=5)))
        for key, value in draw(st.dictionaries(parameter_keys, parameter_values, max_size=2)).items():
            _set(tensor.parameters[key], value)
        if draw(st.booleans()):
            field = draw(st.sampled_from(FIELDS))
            values = {"bool_contents": st.booleans(), "int_contents": st.integers(-(2**31), 2**31 - 1),
                      "int64_contents": st.integers(-(2**63), 2**63 - 1), "uint_contents": st.integers(0, 2**32 - 1),
                      "uint64_contents": st.integers(0, 2**64 - 1), "fp32_contents": st.floats(width=32),
                      "fp64_contents": st.floats(), "bytes_contents": st.binary(max_size=4)}[field]
            getattr(tensor.contents, field).extend(draw(st.lists(values, max_size=40)))
    for _ in range(draw(st.integers(0, 5))):
        request.raw_input_contents.append(draw(st.binary(max_size=80)))
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(name=draw(st.sampled_from(NAMES)))
        for key, value in draw(st.dictionaries(parameter_keys, parameter_values, max_size=2)).items():
            _set(output.parameters[key], value)
    return request


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(request=requests())
def test_any_request_message_is_answered_without_a_server_error(channel: grpc.Channel,
                                                                request: pb.ModelInferRequest) -> None:
    data = request.SerializeToString()
    try:
        pb.ModelInferResponse.FromString(channel.unary_unary(SERVICE + "ModelInfer")(data, timeout=30))
    except grpc.RpcError as exc:
        assert exc.code() not in BAD, (exc.code(), exc.details())
        assert exc.details()
    answers = list(channel.stream_stream(SERVICE + "ModelStreamInfer")(iter([data, data]), timeout=30))
    assert len(answers) == 2


def test_the_server_still_serves(channel: grpc.Channel) -> None:
    request = grpc_infer_request(random_inputs(8, 8, 64, 1, 2), "rope_attention")
    response = pb.ModelInferResponse.FromString(
        channel.unary_unary(SERVICE + "ModelInfer")(request.SerializeToString(), timeout=30))
    assert list(response.outputs[0].shape) == [1, 8, 2, 64]
