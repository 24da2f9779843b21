"""One behaviour suite for inference, run over both protocols of one live `posenc serve`: HTTP (KServe v2 REST,
JSON and binary tensors) and gRPC (`inference.GRPCInferenceService`, raw and typed contents). Each protocol is a
small adapter with the same methods (infer, shared memory, statistics, readiness, config, metadata) that answers
numpy arrays and plain dicts, or raises one `ProtocolError` (the gRPC code's name: over HTTP the one
`posenc.service.errors.GRPC_CODE_NAMES` gives for the status), so every test below is written once.

Black box: only the test kit, the error taxonomy's table, the protocol's messages and the wire."""

from __future__ import annotations

import http.client
import json
import mmap
import os
import re
import socket
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2 as pb

from posenc.service.errors import GRPC_CODE_NAMES
from posenc.service.testing import (
    HEADER_LENGTH,
    SHARED_MEMORY_KEY,
    SHARED_MEMORY_KEY_HEADER,
    RequestedOutput,
    ServerProcess,
    SharedMemory,
    SharedMemoryInput,
    decode_response,
    http_request,
    kserve_request,
    shared_memory_inputs,
)
from tests.onnx_models import REPOSITORY, SHIPPED, geometry, random_inputs, run, session

SERVICE = "/inference.GRPCInferenceService/"
MODEL = "rope_attention"
ADMIN_HEADER, ADMIN_KEY = "x-admin-key", "sesame"
BUDGET = 16 << 20  # POSENC_MEMORY_BUDGET_BYTES: small, and no waiting for it (POSENC_MEMORY_WAIT_SECONDS=0)
SETTINGS = {
    "log_level": "warning",
    "shared_memory": True,
    "memory_budget_bytes": BUDGET,
    "memory_wait_seconds": 0,
    "max_queue_delay_us": 0,
    # one CPU core a run, on any machine (a GPU too): the large run below takes about as long everywhere
    "providers": "cpu",
    "intra_op_num_threads": 1,
    "restricted_api": f"shared-memory:{SHARED_MEMORY_KEY_HEADER}={SHARED_MEMORY_KEY};"
                      f"statistics,model-config:{ADMIN_HEADER}={ADMIN_KEY}",
}
KEYS = {SHARED_MEMORY_KEY_HEADER: SHARED_MEMORY_KEY, ADMIN_HEADER: ADMIN_KEY}
UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class ProtocolError(Exception):
    """A refusal, the same on both protocols: the gRPC status code's name (over HTTP: GRPC_CODE_NAMES[status]),
    the message (HTTP: the body's `error`; gRPC: the status details), and the HTTP status (None over gRPC)."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{code} ({status}): {message}" if status else f"{code}: {message}")
        self.code, self.message, self.status = code, message, status


@dataclass
class Result:
    """An infer answer: the outputs that came back in the answer, and every output's entry (name -> shape,
    datatype, shared-memory parameters)."""

    outputs: dict[str, np.ndarray]
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)


Inputs = Mapping[str, "np.ndarray | SharedMemoryInput"]


class Http:
    name = "http"

    def __init__(self, server: ServerProcess) -> None:
        self.server = server

    def _call(self, path: str, method: str = "GET", body: bytes | None = None,
              headers: Mapping[str, str] | None = None, keys: bool = True) -> tuple[dict[str, str], bytes]:
        all_headers = {**(KEYS if keys else {}), **(headers or {})}
        status, answer_headers, answer = http_request(self.server.port, path, method, body, all_headers,
                                                      timeout=60, host=self.server.host)
        if status >= 400:
            raise ProtocolError(GRPC_CODE_NAMES.get(status, "INTERNAL"), json.loads(answer)["error"], status)
        return answer_headers, answer

    def _json(self, path: str, method: str = "GET", body: bytes | None = None, keys: bool = True) -> Any:
        return json.loads(self._call(path, method, body, keys=keys)[1] or b"null")

    def infer(self, model: str, inputs: Inputs, outputs: Sequence[str | RequestedOutput] | None = None,
              binary: bool = True, keys: bool = True) -> Result:
        # binary tensors in, binary tensors out (Triton answers JSON unless asked otherwise); JSON in, JSON out
        request = kserve_request(inputs, binary=binary, outputs=outputs, binary_output=binary)
        headers, body = self._call(f"/v2/models/{model}/infer", "POST", request.body, request.headers, keys)
        answer = decode_response(body, headers)
        entries = {e["name"]: {"shape": list(e["shape"]), "datatype": e["datatype"],
                               **{k: v for k, v in e.get("parameters", {}).items() if k.startswith("shared_memory")}}
                   for e in answer.header["outputs"]}
        return Result(dict(answer.outputs), entries)

    def register(self, name: str, key: str, byte_size: int, offset: int = 0, keys: bool = True) -> None:
        body = json.dumps({"key": key, "offset": offset, "byte_size": byte_size}).encode()
        self._call(f"/v2/systemsharedmemory/region/{name}/register", "POST", body, keys=keys)

    def unregister(self, name: str | None = None) -> None:
        where = f"/region/{name}" if name else ""
        self._call(f"/v2/systemsharedmemory{where}/unregister", "POST", b"")

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        where = f"/region/{name}" if name else ""
        regions = self._json(f"/v2/systemsharedmemory{where}/status")
        return sorted(({k: r.get(k, 0) for k in ("name", "key", "offset", "byte_size")} for r in regions),
                      key=lambda r: r["name"])

    def statistics(self, model: str, keys: bool = True) -> dict[str, int]:
        (stats,) = self._json(f"/v2/models/{model}/stats", keys=keys)["model_stats"]
        return {"inference_count": int(stats["inference_count"]), "execution_count": int(stats["execution_count"])}

    def ready(self, model: str) -> bool:
        return bool(self._json(f"/v2/models/{model}/ready")["ready"])

    def config(self, model: str, keys: bool = True) -> dict[str, Any]:
        config = self._json(f"/v2/models/{model}/config", keys=keys)
        return config.get("config", config)

    def metadata(self, model: str) -> dict[str, Any]:
        return self._json(f"/v2/models/{model}")


class Grpc:
    name = "grpc"

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel

    def _call(self, method: str, request: Message, answer: type[Message], keys: bool = True) -> Any:
        try:
            data = self.channel.unary_unary(SERVICE + method)(request.SerializeToString(),
                                                              metadata=tuple(KEYS.items()) if keys else (),
                                                              timeout=60)
        except grpc.RpcError as exc:
            raise ProtocolError(exc.code().name, exc.details() or "") from None
        return answer.FromString(data)

    def infer(self, model: str, inputs: Inputs, outputs: Sequence[str | RequestedOutput] | None = None,
              binary: bool = True, keys: bool = True) -> Result:
        answer = self._call("ModelInfer", infer_message(model, inputs, outputs, binary), pb.ModelInferResponse, keys)
        out, entries, raw = {}, {}, iter(answer.raw_output_contents)
        for entry in answer.outputs:
            shm = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in entry.parameters.items()
                   if k.startswith("shared_memory")}
            entries[entry.name] = {"shape": list(entry.shape), "datatype": entry.datatype, **shm}
            if not shm:
                dtype = {"FP32": np.float32, "INT64": np.int64}[entry.datatype]
                out[entry.name] = np.frombuffer(next(raw), dtype).reshape(entry.shape)
        return Result(out, entries)

    def register(self, name: str, key: str, byte_size: int, offset: int = 0, keys: bool = True) -> None:
        self._call("SystemSharedMemoryRegister",
                   pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=byte_size),
                   pb.SystemSharedMemoryRegisterResponse, keys)

    def unregister(self, name: str | None = None) -> None:
        self._call("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name or ""),
                   pb.SystemSharedMemoryUnregisterResponse)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        answer = self._call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name=name or ""),
                            pb.SystemSharedMemoryStatusResponse)
        return sorted(({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                       for r in answer.regions.values()), key=lambda r: r["name"])

    def statistics(self, model: str, keys: bool = True) -> dict[str, int]:
        answer = self._call("ModelStatistics", pb.ModelStatisticsRequest(name=model), pb.ModelStatisticsResponse, keys)
        (stats,) = answer.model_stats
        return {"inference_count": stats.inference_count, "execution_count": stats.execution_count}

    def ready(self, model: str) -> bool:
        return bool(self._call("ModelReady", pb.ModelReadyRequest(name=model), pb.ModelReadyResponse).ready)

    def config(self, model: str, keys: bool = True) -> dict[str, Any]:
        answer = self._call("ModelConfig", pb.ModelConfigRequest(name=model), pb.ModelConfigResponse, keys)
        return MessageToDict(answer.config, preserving_proto_field_name=True)

    def metadata(self, model: str) -> dict[str, Any]:
        answer = self._call("ModelMetadata", pb.ModelMetadataRequest(name=model), pb.ModelMetadataResponse)
        tensors = [[{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in group]
                   for group in (answer.inputs, answer.outputs)]
        return {"name": answer.name, "versions": list(answer.versions), "platform": answer.platform,
                "inputs": tensors[0], "outputs": tensors[1]}


def _shared_memory_parameters(target: Any, place: SharedMemory) -> None:
    target["shared_memory_region"].string_param = place.region
    target["shared_memory_byte_size"].int64_param = place.byte_size
    if place.offset is not None:
        target["shared_memory_offset"].int64_param = place.offset


def infer_message(model: str, inputs: Inputs, outputs: Sequence[str | RequestedOutput] | None = None,
                  binary: bool = True) -> pb.ModelInferRequest:
    """A ModelInferRequest: arrays in `raw_input_contents` (binary) or typed contents, or shared-memory inputs."""
    request = pb.ModelInferRequest(model_name=model)
    for name, value in inputs.items():
        datatype = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64",
                    np.dtype(np.int32): "INT32"}[np.dtype(value.dtype)]
        tensor = request.inputs.add(name=name, datatype=datatype, shape=value.shape)
        if isinstance(value, SharedMemoryInput):
            _shared_memory_parameters(tensor.parameters, value.place)
        elif binary:
            request.raw_input_contents.append(value.tobytes())
        else:
            contents = {"FP32": tensor.contents.fp32_contents, "INT64": tensor.contents.int64_contents,
                        "INT32": tensor.contents.int_contents}[datatype]
            contents.extend(value.ravel().tolist())
    for each in outputs or ():
        wanted = RequestedOutput(each) if isinstance(each, str) else each
        entry = request.outputs.add(name=wanted.name)
        if wanted.shared_memory is not None:
            _shared_memory_parameters(entry.parameters, wanted.shared_memory)
    return request


# -- one server for the module, both ends of it


@dataclass
class Ends:
    server: ServerProcess
    channel: grpc.Channel
    http: Http
    grpc: Grpc


@pytest.fixture(scope="module")
def ends() -> Iterator[Ends]:
    with ServerProcess(SETTINGS, grpc=True) as server, \
            grpc.insecure_channel(server.grpc_address, options=UNLIMITED) as channel:
        yield Ends(server, channel, Http(server), Grpc(channel))


@pytest.fixture(params=["http", "grpc"])
def protocol(request: pytest.FixtureRequest, ends: Ends) -> Http | Grpc:
    return getattr(ends, request.param)


@cache
def _session(model: str) -> Any:
    return session(REPOSITORY / model / "model.onnx")


def _reference(model: str, inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    return run(_session(model), dict(inputs))


def _unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


# -- metadata, readiness, config


def test_metadata_readiness_and_the_datatypes_accepted(protocol: Http | Grpc) -> None:
    """Every shipped model is ready and takes FP32 query/key/value and INT64 position_ids, and answers FP32: the
    datatypes the suite's inferences below send."""
    datatypes = set()
    for model in SHIPPED:
        assert protocol.ready(model)
        metadata = protocol.metadata(model)
        hq, hkv, dim = geometry(model)
        assert metadata["name"] == model and metadata["versions"] == ["1"]
        assert [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]] == [
            ("query", "FP32", [-1, hq, -1, dim]), ("key", "FP32", [-1, hkv, -1, dim]),
            ("value", "FP32", [-1, hkv, -1, dim]), ("position_ids", "INT64", [-1, -1])]
        assert [(t["name"], t["datatype"]) for t in metadata["outputs"]] == [("output", "FP32")]
        datatypes |= {t["datatype"] for t in metadata["inputs"] + metadata["outputs"]}
    assert datatypes == {"FP32", "INT64"}


def test_config(protocol: Http | Grpc) -> None:
    config = protocol.config(MODEL)
    assert config["name"] == MODEL and int(config["max_batch_size"]) == 8
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [
        ("query", "TYPE_FP32"), ("key", "TYPE_FP32"), ("value", "TYPE_FP32"), ("position_ids", "TYPE_INT64")]
    assert [(t["name"], t["data_type"]) for t in config["output"]] == [("output", "TYPE_FP32")]


def test_metadata_and_config_are_the_same_on_both_protocols(ends: Ends) -> None:
    for model in SHIPPED:
        over_http, over_grpc = ends.http.metadata(model), ends.grpc.metadata(model)
        for key in ("name", "versions", "platform", "inputs", "outputs"):
            assert over_http[key] == over_grpc[key], (model, key)
    http_config, grpc_config = ends.http.config(MODEL), ends.grpc.config(MODEL)
    for key in ("name", "platform", "backend", "max_batch_size"):
        assert str(http_config.get(key)) == str(grpc_config.get(key)), key
    for group in ("input", "output"):
        assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in http_config[group]] == \
            [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in grpc_config[group]]


# -- results


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "typed"])
def test_every_shipped_model_equals_onnxruntime(protocol: Http | Grpc, binary: bool) -> None:
    """Every model (its FP32 and INT64 inputs), sent as binary tensors (HTTP binary extension, gRPC
    raw_input_contents) or typed values (HTTP JSON `data`, gRPC typed contents): onnxruntime's answer."""
    for i, model in enumerate(SHIPPED):
        inputs = random_inputs(*geometry(model), 2, 3, seed=i, start=17 * i)
        result = protocol.infer(model, inputs, binary=binary)
        assert list(result.outputs) == ["output"]
        got = result.outputs["output"]
        assert got.dtype == np.float32 and got.shape == inputs["query"].shape
        np.testing.assert_allclose(got, _reference(model, inputs), atol=1e-5, rtol=1e-5, err_msg=model)


def test_results_are_bit_identical_across_protocols_and_encodings(ends: Ends) -> None:
    for model in ("rope_attention", "qwen2_5_7b_yarn_attention"):
        inputs = random_inputs(*geometry(model), 3, 5, seed=3, start=40)
        answers = {(p.name, binary): p.infer(model, inputs, binary=binary).outputs["output"]
                   for p in (ends.http, ends.grpc) for binary in (True, False)}
        first = answers[("http", True)]
        for key, got in answers.items():
            np.testing.assert_array_equal(got, first, err_msg=f"{model} {key}")


def test_requested_outputs(protocol: Http | Grpc) -> None:
    """The models have one output: asked for by name (binary, or JSON over HTTP) it is what an infer without
    `outputs` answers; an unknown name is refused."""
    inputs = random_inputs(8, 8, 64, 1, 4, seed=5)
    plain = protocol.infer(MODEL, inputs).outputs
    for outputs in (["output"], [RequestedOutput("output", binary=False)], [RequestedOutput("output", binary=True)]):
        named = protocol.infer(MODEL, inputs, outputs=outputs).outputs
        assert list(named) == ["output"]
        np.testing.assert_array_equal(named["output"], plain["output"])
    with pytest.raises(ProtocolError) as refused:
        protocol.infer(MODEL, inputs, outputs=["output", "scores"])
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.message == "unknown output(s) ['scores']; model 'rope_attention' returns ['output']"


def _inputs(**changes: np.ndarray | None) -> dict[str, np.ndarray]:
    inputs = {**random_inputs(8, 8, 64, 1, 2, start=11), **changes}
    return {k: v for k, v in inputs.items() if v is not None}


TAKES = "model 'rope_attention' takes ['query', 'key', 'value', 'position_ids']"
INVALID = [
    ("unknown-model", "no_such_model", _inputs(), "NOT_FOUND",
     "unknown model 'no_such_model'; known: ['gemma_2b_attention', 'llama3_1_attention', 'phi3_5_mini_attention', "
     "'qwen2_5_7b_attention', 'qwen2_5_7b_yarn_attention', 'rope_attention']"),
    ("wrong-name", MODEL, {("queries" if k == "query" else k): v for k, v in _inputs().items()}, "INVALID_ARGUMENT",
     f"unknown input(s) ['queries']; {TAKES}"),
    ("missing", MODEL, _inputs(position_ids=None), "INVALID_ARGUMENT", f"missing input(s) ['position_ids']; {TAKES}"),
    ("datatype", MODEL, _inputs(position_ids=_inputs()["position_ids"].astype(np.int32)), "INVALID_ARGUMENT",
     "input 'position_ids': datatype INT32, the model expects INT64"),
    ("rank", MODEL, _inputs(query=np.zeros((8, 2, 64), np.float32)), "INVALID_ARGUMENT",
     "input 'query': shape [8, 2, 64] has rank 3, the model expects [-1, 8, -1, 64] (-1 = any)"),
]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "typed"])
@pytest.mark.parametrize(("model", "inputs", "code", "message"), [case[1:] for case in INVALID],
                         ids=[case[0] for case in INVALID])
def test_validation_errors(protocol: Http | Grpc, binary: bool, model: str, inputs: dict[str, np.ndarray],
                           code: str, message: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        protocol.infer(model, inputs, binary=binary)
    assert (refused.value.code, refused.value.message) == (code, message)
    assert refused.value.status in (None, 400, 404)


# -- shared memory


@contextmanager
def posix_object(size: int) -> Iterator[tuple[str, mmap.mmap]]:
    """A POSIX shared-memory object of `size` bytes in /dev/shm, made without multiprocessing's resource tracker:
    its key and a map of it."""
    name = _unique("posenc_behaviour")
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mapped:
            yield f"/{name}", mapped
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{name}")


def test_shared_memory_inputs_and_outputs(protocol: Http | Grpc) -> None:
    inputs = random_inputs(8, 8, 64, 2, 6, seed=9, start=100)
    in_size = sum(a.nbytes for a in inputs.values())
    out_size = inputs["query"].nbytes
    region_in, region_out = _unique("in"), _unique("out")
    with posix_object(in_size) as (in_key, in_map), posix_object(out_size + 64) as (out_key, out_map):
        in_map[:] = b"".join(a.tobytes() for a in inputs.values())
        protocol.register(region_in, in_key, in_size)
        protocol.register(region_out, out_key, out_size + 64)
        try:
            regions = {r["name"]: r for r in protocol.status()}
            assert regions[region_in] == {"name": region_in, "key": in_key, "offset": 0, "byte_size": in_size}
            assert protocol.status(region_out) == [{"name": region_out, "key": out_key, "offset": 0,
                                                    "byte_size": out_size + 64}]
            out = RequestedOutput("output", shared_memory=SharedMemory(region_out, out_size, 64))
            result = protocol.infer(MODEL, shared_memory_inputs(inputs, region_in), outputs=[out])
            assert result.outputs == {}
            assert result.entries["output"] == {"shape": [2, 8, 6, 64], "datatype": "FP32",
                                                "shared_memory_region": region_out,
                                                "shared_memory_byte_size": out_size, "shared_memory_offset": 64}
            got = np.frombuffer(out_map, np.float32, out_size // 4, 64).reshape(2, 8, 6, 64).copy()
            np.testing.assert_array_equal(got, protocol.infer(MODEL, inputs).outputs["output"])
            np.testing.assert_allclose(got, _reference(MODEL, inputs), atol=1e-5, rtol=1e-5)
            # shared-memory inputs, the output in the answer
            mixed = protocol.infer(MODEL, shared_memory_inputs(inputs, region_in)).outputs["output"]
            np.testing.assert_array_equal(mixed, got)
        finally:
            protocol.unregister(region_in)
            protocol.unregister(region_out)
        assert {r["name"] for r in protocol.status()}.isdisjoint({region_in, region_out})


def test_a_region_unregistered_is_refused_by_name(protocol: Http | Grpc) -> None:
    inputs = random_inputs(8, 8, 64, 1, 3, seed=2)
    size = sum(a.nbytes for a in inputs.values())
    region = _unique("lease")
    with posix_object(size) as (key, mapped):
        mapped[:] = b"".join(a.tobytes() for a in inputs.values())
        protocol.register(region, key, size)
        first = protocol.infer(MODEL, shared_memory_inputs(inputs, region)).outputs["output"]
        np.testing.assert_allclose(first, _reference(MODEL, inputs), atol=1e-5, rtol=1e-5)
        protocol.unregister(region)
        protocol.unregister(region)  # Triton: unregistering an unknown name changes nothing
        with pytest.raises(ProtocolError) as gone:
            protocol.infer(MODEL, shared_memory_inputs(inputs, region))
        assert gone.value.code == "INVALID_ARGUMENT"
        assert f"no shared-memory region named '{region}' is registered" in gone.value.message
        with pytest.raises(ProtocolError) as status:
            protocol.status(region)
        assert (status.value.code, status.value.message) == (
            "NOT_FOUND", f"no shared-memory region named '{region}' is registered")


def test_registering_an_object_that_does_not_exist(protocol: Http | Grpc) -> None:
    key = "/" + _unique("posenc_absent")
    with pytest.raises(ProtocolError) as refused:
        protocol.register(_unique("absent"), key, 64)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.message == (f"no shared-memory object '{key}' on this host (create it with shm_open before "
                                     "registering; the server and the client must share /dev/shm)")


# -- restricted groups


def test_restricted_groups(protocol: Http | Grpc) -> None:
    """statistics and model-config need the admin key, shared memory its own key; the rest stays open."""
    for call, group in ((protocol.statistics, "statistics"), (protocol.config, "model-config")):
        with pytest.raises(ProtocolError) as refused:
            call(MODEL, keys=False)
        assert refused.value.code == "PERMISSION_DENIED"
        assert f"is in the restricted protocol group '{group}': send the header '{ADMIN_HEADER}'" \
            in refused.value.message and ADMIN_KEY not in refused.value.message
    with pytest.raises(ProtocolError) as refused:
        protocol.register(_unique("r"), "/" + _unique("posenc_absent"), 64, keys=False)
    assert refused.value.code == "PERMISSION_DENIED" and SHARED_MEMORY_KEY_HEADER in refused.value.message
    assert SHARED_MEMORY_KEY not in refused.value.message
    inputs = random_inputs(8, 8, 64, 1, 2)
    np.testing.assert_allclose(protocol.infer(MODEL, inputs, keys=False).outputs["output"],
                               _reference(MODEL, inputs), atol=1e-5, rtol=1e-5)
    assert protocol.statistics(MODEL)["inference_count"] >= 1


# -- statistics


def test_statistics_count_the_rows_of_each_protocol(protocol: Http | Grpc) -> None:
    model = "gemma_2b_attention"  # no other test of this module runs it after the datatype test
    before = protocol.statistics(model)
    for batch in (3, 2, 1):
        protocol.infer(model, random_inputs(*geometry(model), batch, 4, seed=batch))
    after = protocol.statistics(model)
    assert after["inference_count"] - before["inference_count"] == 6
    assert 1 <= after["execution_count"] - before["execution_count"] <= 3


# -- the memory budget


@contextmanager
def held_budget(server: ServerProcess, declared: int) -> Iterator[socket.socket]:
    """An HTTP infer whose head declares a `declared`-byte body, of which one byte is sent: the server holds
    3 × declared bytes of its memory budget while it waits for the rest; closing the connection gives them back."""
    conn = socket.create_connection((server.host, server.port), timeout=30)
    try:
        head = (f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: {server.host}\r\nContent-Length: {declared}\r\n"
                f"{HEADER_LENGTH}: 100\r\n\r\n{{")
        conn.sendall(head.encode())
        yield conn
    finally:
        conn.close()


BUSY = re.compile(rf"busy: an inference on '[a-z0-9_]+' needs (\d+) bytes and (\d+) of {BUDGET} stayed in use for 0 s "
                  r"\(POSENC_MEMORY_BUDGET_BYTES\); retry later")
# gRPC: a message's read holds 2 × POSENC_MAX_REQUEST_BYTES (here: the whole budget) until it has arrived
RECEIVING = re.compile(rf"busy: a gRPC message being received needs {BUDGET} bytes and (\d+) of {BUDGET} stayed in "
                       r"use for 0 s \(POSENC_MEMORY_BUDGET_BYTES\); retry later")


def _refused_for_memory(protocol: Http | Grpc, inputs: dict[str, np.ndarray], seconds: float = 10) -> ProtocolError:
    """The refusal of `inputs`, retried while the other request has not yet reserved its memory."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            protocol.infer(MODEL, inputs)
        except ProtocolError as exc:
            return exc
        assert time.monotonic() < deadline, "never refused"
        time.sleep(0.05)


def _served_again(protocol: Http | Grpc, inputs: dict[str, np.ndarray], model: str = MODEL,
                  seconds: float = 15) -> Result:
    """`inputs` served once the memory held by another request is back (no waiting for memory: a 503 until then)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return protocol.infer(model, inputs)
        except ProtocolError as exc:
            if not (BUSY.fullmatch(exc.message) or RECEIVING.fullmatch(exc.message)) or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def test_budget_refusal(ends: Ends, protocol: Http | Grpc) -> None:
    """With 15 of the 16 MiB budget held by a request in flight (an HTTP body that has not arrived yet), a large
    request (1.5 MiB: 4.5 MiB to hold) is refused at once (503 over HTTP, RESOURCE_EXHAUSTED over gRPC, never
    waiting: POSENC_MEMORY_WAIT_SECONDS=0); once the holder goes, the large one is served. Over HTTP a small one is
    served meanwhile. Over gRPC a message's size is unknown until it has arrived, so its read holds
    2 × POSENC_MAX_REQUEST_BYTES (here: the whole budget) first: the small one is refused too, the refusal naming
    the read, before any of its bytes were taken."""
    large = random_inputs(8, 8, 64, 1, 256, seed=1)
    small = random_inputs(8, 8, 64, 1, 2, seed=1)
    with held_budget(ends.server, 5 << 20):
        refused = _refused_for_memory(protocol, large)
        if protocol.name == "http":
            assert refused.status == 503
            match = BUSY.fullmatch(refused.message)
            assert match, refused.message
            assert int(match.group(1)) >= 3 * sum(a.nbytes for a in large.values())
            assert int(match.group(2)) >= 3 * (5 << 20)
            protocol.infer(MODEL, small)
        else:
            for inputs in (large, small):
                refused = _refused_for_memory(protocol, inputs)
                match = RECEIVING.fullmatch(refused.message)
                assert refused.code == "RESOURCE_EXHAUSTED" and match, refused.message
                assert int(match.group(1)) >= 3 * (5 << 20)
    np.testing.assert_allclose(_served_again(protocol, large).outputs["output"], _reference(MODEL, large),
                               atol=1e-5, rtol=1e-5)


# -- cancellation

LARGE = (8, 8, 64, 1, 4096)  # rope_attention: 24 MiB of input, 8 heads × 4096² scores: tenths of a second on a core
PROBE_MODEL = "qwen2_5_7b_attention"
PROBE = (28, 4, 128, 8, 40)  # 5.6 MiB of input (16.9 MiB to hold: more than the whole budget), little to compute
_durations: dict[str, float] = {}


def _full_duration(protocol: Http | Grpc) -> float:
    """How long the large request takes when nobody gives up on it (the faster of two, once per protocol)."""
    if protocol.name not in _durations:
        inputs = random_inputs(*LARGE, seed=4)
        times = []
        for _ in range(2):
            start = time.monotonic()
            protocol.infer(MODEL, inputs)
            times.append(time.monotonic() - start)
        _durations[protocol.name] = min(times)
    return _durations[protocol.name]


def _give_up(ends: Ends, protocol: Http | Grpc, inputs: dict[str, np.ndarray], after: float) -> None:
    """Send the request and give up on it `after` seconds: HTTP hangs up, gRPC cancels the call."""
    if protocol.name == "http":
        request = kserve_request(inputs, binary_output=True)
        conn = http.client.HTTPConnection(ends.server.host, ends.server.port, timeout=30)
        try:
            start = time.monotonic()
            conn.request("POST", f"/v2/models/{MODEL}/infer", body=request.body, headers=request.headers)
            time.sleep(max(0.0, after - (time.monotonic() - start)))
        finally:
            conn.close()
    else:
        call = ends.channel.unary_unary(SERVICE + "ModelInfer").future(
            infer_message(MODEL, inputs).SerializeToString(), timeout=60)
        time.sleep(after)
        assert call.cancel() or call.done()


def _settled(protocol: Http | Grpc, model: str, seconds: float = 30) -> dict[str, int]:
    """The model's statistics once they stop moving (the same twice, 0.3 s apart)."""
    deadline, last = time.monotonic() + seconds, protocol.statistics(model)
    while True:
        time.sleep(0.3)
        now = protocol.statistics(model)
        if now == last:
            return now
        assert time.monotonic() < deadline, "the statistics never stopped moving"
        last = now


def test_cancellation(ends: Ends, protocol: Http | Grpc) -> None:
    """A large request given up by its client in the middle of its run (HTTP: the connection closed; gRPC: the call
    cancelled): the server answers readiness within a second, and soon holds nothing for it: a request that needs
    the whole memory budget (refused at once while anything holds part of it) is served, the statistics stop
    moving (at most the one row counted), no HTTP request but the metrics' own is in flight and the model's queue
    is empty."""
    full = _full_duration(protocol)
    before = protocol.statistics(MODEL)["inference_count"]
    _give_up(ends, protocol, random_inputs(*LARGE, seed=4), full / 3)
    # the answer within a second: a socket timeout of 1 s raises otherwise
    status, _, _ = http_request(ends.server.port, "/v2/health/ready", timeout=1, host=ends.server.host)
    assert status == 200
    probe = random_inputs(*PROBE, seed=6)
    got = _served_again(protocol, probe, PROBE_MODEL, 30).outputs["output"]
    np.testing.assert_allclose(got, _reference(PROBE_MODEL, probe), atol=1e-5, rtol=1e-5)
    assert _settled(protocol, MODEL)["inference_count"] - before in (0, 1)
    metrics = http_request(ends.server.port, "/metrics", host=ends.server.host)[2].decode()
    gauges = [line for line in metrics.splitlines() if "in_flight" in line or "queue_depth" in line]
    assert re.search(r"^posenc_http_requests_in_flight 1(\.0)?$", metrics, re.MULTILINE), gauges
    assert re.search(rf'^posenc_queue_depth{{model="{MODEL}"}} 0(\.0)?$', metrics, re.MULTILINE), gauges


def test_a_run_given_up_keeps_its_memory_until_it_ends(ends: Ends, protocol: Http | Grpc) -> None:
    """The memory budget bounds what the server holds: a request given up in the middle of its run holds its
    reservation until the run is over. Whenever a request that needs the whole budget is first admitted after the
    large one was given up, the large one's run is over: the statistics count it already (or never: given up
    before it ran, which is tried again with a later moment). (At 8a19fa0 a cancelled gRPC call gave its
    reservation back at once, while its run went on; a client that hung up over HTTP kept it until the run ended.)"""
    full = _full_duration(protocol)
    probe = random_inputs(*PROBE, seed=6)
    for fraction in (0.3, 0.5, 0.7, 0.9):
        before = protocol.statistics(MODEL)["inference_count"]
        _give_up(ends, protocol, random_inputs(*LARGE, seed=4), full * fraction)
        _served_again(protocol, probe, PROBE_MODEL, 30)
        counted_when_admitted = protocol.statistics(MODEL)["inference_count"]
        final = _settled(protocol, MODEL)["inference_count"]
        if final == before:
            continue  # given up before its run began: nothing held to look at
        assert counted_when_admitted == final, (
            f"the whole budget was free while the run given up was still going ({counted_when_admitted - before} "
            f"of {final - before} rows counted when the next request was admitted)")
        return
    pytest.fail("every large request was given up before its run began")
