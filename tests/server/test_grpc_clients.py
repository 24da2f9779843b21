"""tritonclient.grpc, unchanged, against `posenc serve`'s gRPC service: sync, asyncio, streaming and system shared
memory, with the answers of the HTTP side and of onnxruntime alone."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import uuid
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from posenc.models.dtypes import lookup
from posenc.service.errors import GRPC_DETAILS_BYTES
from posenc.service.request_kit import phases
from posenc.service.testing import SHARED_MEMORY_HEADERS, ServerProcess, shared_memory_key_settings
from tests.onnx_models import REPOSITORY, SHIPPED, grpc_infer_request, random_inputs, run, session, triton_inputs

MODEL = "rope_attention"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    settings = {"shared_memory": True, "log_level": "warning", "server_timing": True, **shared_memory_key_settings()}
    with ServerProcess(settings, grpc=True) as process:
        yield process


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


def grpc_inputs(inputs: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    out = []
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), lookup(array.dtype).kserve)
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def expected(inputs: dict[str, np.ndarray], model: str = MODEL) -> np.ndarray:
    return run(session(REPOSITORY / model / "model.onnx"), inputs)


def test_health_metadata_config_statistics_index(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    metadata = client.get_server_metadata()
    assert metadata.name == "posenc" and "system_shared_memory" in metadata.extensions
    model = client.get_model_metadata("llama3_1_attention")
    assert model.platform == "onnxruntime_onnx" and list(model.versions) == ["1"]
    query = model.inputs[0]
    assert (query.name, query.datatype, list(query.shape)) == ("query", "FP32", [-1, 32, -1, 128])
    config = client.get_model_config(MODEL, as_json=True)["config"]
    assert config["name"] == MODEL and config["input"][0]["data_type"] == "TYPE_FP32"
    index = client.get_model_repository_index(as_json=True)["models"]
    assert [entry["name"] for entry in index] == list(SHIPPED) and {e["state"] for e in index} == {"READY"}
    client.infer(MODEL, grpc_inputs(random_inputs(8, 8, 64, 1, 3)))
    stats = client.get_inference_statistics(MODEL, as_json=True)["model_stats"][0]
    assert stats["name"] == MODEL and int(stats["inference_count"]) >= 1


def test_infer_equals_http_and_onnxruntime(server: ServerProcess, client: grpcclient.InferenceServerClient) -> None:
    inputs = random_inputs(8, 8, 64, 2, 6, start=123)
    result = client.infer(MODEL, grpc_inputs(inputs), outputs=[grpcclient.InferRequestedOutput("output")],
                          request_id="abc-42")
    assert result.get_response().id == "abc-42" and result.get_response().model_name == MODEL
    got = result.as_numpy("output")
    assert got.dtype == np.float32 and got.shape == (2, 8, 6, 64)
    http = httpclient.InferenceServerClient(server.address)
    try:
        np.testing.assert_array_equal(got, http.infer(MODEL, triton_inputs(inputs, True)).as_numpy("output"))
    finally:
        http.close()
    np.testing.assert_allclose(got, expected(inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model", ["llama3_1_attention", "gemma_2b_attention"])
def test_every_geometry(client: grpcclient.InferenceServerClient, model: str) -> None:
    from tests.onnx_models import geometry

    inputs = random_inputs(*geometry(model), 1, 5, start=7)
    np.testing.assert_allclose(client.infer(model, grpc_inputs(inputs)).as_numpy("output"), expected(inputs, model),
                               atol=1e-5, rtol=1e-5)


def test_errors_are_status_codes_with_the_http_text(server: ServerProcess,
                                                    client: grpcclient.InferenceServerClient) -> None:
    http = httpclient.InferenceServerClient(server.address)
    bad = random_inputs(8, 8, 64, 1, 2)
    bad["query"] = np.zeros((1, 8, 2, 32), np.float32)
    cases = [("no_such_model", random_inputs(8, 8, 64, 1, 2), "StatusCode.NOT_FOUND", "404"),
             (MODEL, bad, "StatusCode.INVALID_ARGUMENT", "400")]
    try:
        for model, inputs, code, status in cases:
            with pytest.raises(InferenceServerException) as over_grpc:
                client.infer(model, grpc_inputs(inputs))
            with pytest.raises(InferenceServerException) as over_http:
                http.infer(model, triton_inputs(inputs, True))
            assert over_grpc.value.status() == code and over_http.value.status() == status
            assert over_grpc.value.message() == over_http.value.message()
    finally:
        http.close()


@pytest.mark.parametrize("count", [1_000, 20_000])
def test_an_error_naming_thousands_of_outputs_stays_short(client: grpcclient.InferenceServerClient,
                                                          count: int) -> None:
    """Unknown output names, each repeated in the error, made a status message over the client's metadata limit
    (RESOURCE_EXHAUSTED in place of INVALID_ARGUMENT at 1,000 names; 20 MB at 20,000): the message is cut, and says
    how much was left out."""
    outputs = [grpcclient.InferRequestedOutput(f"no_such_output_{i:05d}") for i in range(count)]
    with pytest.raises(InferenceServerException) as info:
        client.infer(MODEL, grpc_inputs(random_inputs(8, 8, 64, 1, 2)), outputs=outputs)
    message = info.value.message()
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT", message[:200]
    assert message.startswith("unknown output(s) ['no_such_output_00000', 'no_such_output_00001'")
    assert len(message.encode()) <= GRPC_DETAILS_BYTES and re.search(r"and \d+ more", message), message


def test_an_error_repeating_a_long_value_is_cut_with_a_count(server: ServerProcess) -> None:
    """A message that lists no names but repeats a value of the request (a 100,000-character parameter) is cut to
    GRPC_DETAILS_BYTES in the one place errors become statuses, and says how many characters were left out."""
    request = grpc_infer_request(random_inputs(8, 8, 64, 1, 2), MODEL)
    request.parameters["binary_data_output"].string_param = "x" * 100_000
    with grpc.insecure_channel(server.grpc_address) as channel, pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(request.SerializeToString(), timeout=30)
    details = info.value.details() or ""
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, details[:200]
    assert details.startswith("request: parameter 'binary_data_output' must be true or false (got 'xxx")
    assert len(details.encode()) <= GRPC_DETAILS_BYTES and re.search(r"… \(\d+ more characters\)$", details)


def test_asyncio_client(server: ServerProcess) -> None:
    inputs = [random_inputs(8, 8, 64, 1, 4, start=i) for i in range(8)]

    async def main() -> list[np.ndarray]:
        client = aioclient.InferenceServerClient(server.grpc_address)
        try:
            assert await client.is_server_ready()
            tensors = []
            for each in inputs:
                tensors.append([])
                for name, array in each.items():
                    tensor = aioclient.InferInput(name, list(array.shape), lookup(array.dtype).kserve)
                    tensor.set_data_from_numpy(array)
                    tensors[-1].append(tensor)
            results = await asyncio.gather(*(client.infer(MODEL, t) for t in tensors))
            return [result.as_numpy("output") for result in results]
        finally:
            await client.close()

    for got, each in zip(asyncio.run(main()), inputs, strict=True):
        np.testing.assert_allclose(got, expected(each), atol=1e-5, rtol=1e-5)


def test_stream_answers_every_request_in_order_and_errors_alone(client: grpcclient.InferenceServerClient) -> None:
    """tritonclient's start_stream / async_stream_infer: 12 requests, one of them for an unknown model, each
    answered once, in order; the bad one with the HTTP text, the others with their outputs."""
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    inputs = [random_inputs(8, 8, 64, 1, 3, start=i) for i in range(12)]
    try:
        for i, each in enumerate(inputs):
            client.async_stream_infer("no_such_model" if i == 5 else MODEL, grpc_inputs(each), request_id=str(i))
        got = [answers.get(timeout=60) for _ in inputs]
    finally:
        client.stop_stream()
    for i, (result, error) in enumerate(got):
        if i == 5:
            assert result is None and "unknown model 'no_such_model'" in str(error)
            continue
        assert error is None
        assert result.get_response().id == str(i)  # type: ignore[attr-defined]
        np.testing.assert_allclose(result.as_numpy("output"), expected(inputs[i]), atol=1e-5, rtol=1e-5)  # type: ignore[attr-defined]


def _name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


def test_system_shared_memory(client: grpcclient.InferenceServerClient) -> None:
    """tritonclient's simple_grpc_shm_client flow, the key as call metadata: results equal the raw path's."""
    headers = dict(SHARED_MEMORY_HEADERS)
    inputs = random_inputs(8, 8, 64, 2, 7, start=5)
    in_size = sum(array.nbytes for array in inputs.values())
    out_size = inputs["query"].nbytes
    in_key, out_key = _name("/posenc_grpc_in"), _name("/posenc_grpc_out")
    in_handle = shm.create_shared_memory_region("grpc_in", in_key, in_size)
    out_handle = shm.create_shared_memory_region("grpc_out", out_key, out_size)
    try:
        shm.set_shared_memory_region(in_handle, list(inputs.values()))
        with pytest.raises(InferenceServerException) as refused:
            client.register_system_shared_memory("grpc_in", in_key, in_size)
        assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "posenc-shared-memory-key" in refused.value.message()
        client.register_system_shared_memory("grpc_in", in_key, in_size, headers=headers)
        client.register_system_shared_memory("grpc_out", out_key, out_size, headers=headers)
        status = client.get_system_shared_memory_status(headers=headers, as_json=True)["regions"]
        assert status["grpc_in"] == {"name": "grpc_in", "key": in_key, "byte_size": str(in_size)}
        tensors, offset = [], 0
        for name, array in inputs.items():
            tensor = grpcclient.InferInput(name, list(array.shape), lookup(array.dtype).kserve)
            tensor.set_shared_memory("grpc_in", array.nbytes, offset=offset)
            tensors.append(tensor)
            offset += array.nbytes
        output = grpcclient.InferRequestedOutput("output")
        output.set_shared_memory("grpc_out", out_size)
        result = client.infer(MODEL, tensors, outputs=[output], headers=headers)
        entry = result.get_output("output")
        assert entry.parameters["shared_memory_region"].string_param == "grpc_out"
        got = shm.get_contents_as_numpy(out_handle, np.float32, list(entry.shape))
        np.testing.assert_array_equal(got, client.infer(MODEL, grpc_inputs(inputs)).as_numpy("output"))
        with pytest.raises(InferenceServerException) as without_key:
            client.infer(MODEL, tensors, outputs=[output])
        assert without_key.value.status() == "StatusCode.PERMISSION_DENIED"
        client.unregister_system_shared_memory("grpc_in", headers=headers)
        with pytest.raises(InferenceServerException) as gone:
            client.get_system_shared_memory_status("grpc_in", headers=headers)
        assert gone.value.status() == "StatusCode.NOT_FOUND"
    finally:
        client.unregister_system_shared_memory(headers=headers)
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def test_health_and_reflection(server: ServerProcess) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(server.grpc_address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        serving = health_pb2.HealthCheckResponse.SERVING
        for service in ("", "inference.GRPCInferenceService", MODEL):
            assert check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == serving
        with pytest.raises(grpc.RpcError) as unknown:
            check(health_pb2.HealthCheckRequest(service="no_such_model"), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                                 timeout=10))
        names = {s.name for s in answers[0].list_services_response.service}
        assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= names
        # what `grpcurl describe` asks: the file declaring the service, with the files it imports
        request = reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.ModelInferRequest")
        (answer,) = stub.ServerReflectionInfo(iter([request]), timeout=10)
        from google.protobuf import descriptor_pb2

        files = {descriptor_pb2.FileDescriptorProto.FromString(raw).name
                 for raw in answer.file_descriptor_response.file_descriptor_proto}
        assert {"grpc_service.proto", "model_config.proto"} <= files


def test_metrics_count_grpc_calls_by_method_and_code(server: ServerProcess,
                                                     client: grpcclient.InferenceServerClient) -> None:
    from posenc.service.testing import http_request

    with pytest.raises(InferenceServerException):
        client.get_model_metadata("no_such_model")
    _, _, body = http_request(server.port, "/metrics", host=server.host)
    text = body.decode()
    assert 'posenc_grpc_requests_total{code="NOT_FOUND",method="ModelMetadata"}' in text
    assert 'posenc_grpc_requests_total{code="OK",method="ModelInfer"}' in text



def test_server_timing_in_the_trailing_metadata(server: ServerProcess) -> None:
    """POSENC_SERVER_TIMING: a ModelInfer ends with its phases as `server-timing` trailing metadata; a failed one
    and other methods carry none."""

    request = grpc_infer_request(random_inputs(8, 8, 64, 1, 16), MODEL)
    with grpc.insecure_channel(server.grpc_address) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        _, call = infer.with_call(request.SerializeToString(), timeout=30)
        spans = phases.parse(dict(call.trailing_metadata())["server-timing"])
        assert list(spans) == ["admit", "read", "parse", "queue", "run", "encode", "total"] and spans["run"] > 0
        del request.inputs[-1], request.raw_input_contents[-1]
        with pytest.raises(grpc.RpcError) as failed:
            infer.with_call(request.SerializeToString(), timeout=30)
        assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "server-timing" not in dict(failed.value.trailing_metadata() or ())
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
        _, call = live.with_call(b"", timeout=10)
        assert "server-timing" not in dict(call.trailing_metadata())
