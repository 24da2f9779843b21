"""The same bad requests over HTTP (KServe v2 REST) and over gRPC (`inference.GRPCInferenceService`) against one live
`posenc serve`: each is refused on both, the gRPC code is the one `posenc.service.errors.GRPC_CODE_NAMES` gives for
the HTTP status, and the HTTP body's `error` text is the gRPC status's details, character for character. Where a
message names the protocol's own part (the route or the method called, the field that carries the bytes) both
texts are compared with that one part replaced; a message over gRPC's own size limit is compared by code only.

Black box: only the test kit, the error taxonomy's table, the protocol's messages and the wire."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2 as pb

from posenc.service.errors import GRPC_CODE_NAMES
from posenc.service.testing import (
    SHARED_MEMORY_KEY,
    SHARED_MEMORY_KEY_HEADER,
    ServerProcess,
    SharedMemory,
    SharedMemoryInput,
    http_request,
    kserve_request,
    request_with_header,
)
from tests.onnx_models import grpc_infer_request, random_inputs
from tests.server.test_restricted_keys import http_get

SERVICE = "/inference.GRPCInferenceService/"
MODEL = "rope_attention"
ADMIN_HEADER, ADMIN_KEY = "x-admin-key", "sesame"
ADMIN = {ADMIN_HEADER: ADMIN_KEY}
SHM = {SHARED_MEMORY_KEY_HEADER: SHARED_MEMORY_KEY}
LIMIT = 1 << 20  # POSENC_MAX_REQUEST_BYTES of the server: 1 MiB
SETTINGS = {
    "log_level": "warning",
    "shared_memory": True,
    "max_request_bytes": LIMIT,
    "restricted_api": f"shared-memory:{SHARED_MEMORY_KEY_HEADER}={SHARED_MEMORY_KEY};"
                      f"statistics,model-config:{ADMIN_HEADER}={ADMIN_KEY}",
}


@dataclass
class Ends:
    """Both ends of the one server: its HTTP port and a gRPC channel to it."""

    server: ServerProcess
    channel: grpc.Channel


@pytest.fixture(scope="module")
def ends() -> Iterator[Ends]:
    with ServerProcess(SETTINGS, grpc=True) as server, grpc.insecure_channel(server.grpc_address) as channel:
        yield Ends(server, channel)


# -- the two protocols' calls: each answers (HTTP status, `error` text) or (gRPC code's name, details)

HttpAnswer = tuple[int, str]
GrpcAnswer = tuple[str, str]


def _http(ends: Ends, path: str, method: str = "GET", body: bytes | None = None,
          headers: Mapping[str, str] | None = None) -> HttpAnswer:
    status, _, answer = http_request(ends.server.port, path, method, body, headers, timeout=30, host=ends.server.host)
    try:
        error = json.loads(answer).get("error", "")
    except (ValueError, AttributeError):
        error = answer.decode(errors="replace")
    return status, error


def _http_pairs(ends: Ends, path: str, headers: Sequence[tuple[str, str]]) -> HttpAnswer:
    """A GET with `headers` as given, repeated names included (http_request takes a dict)."""
    status, body = http_get(ends.server, path, *headers)
    return status, json.loads(body).get("error", "")


def _infer_http(ends: Ends, inputs: Mapping[str, np.ndarray | SharedMemoryInput], model: str = MODEL,
                version: str | None = None, binary: bool = True, headers: Mapping[str, str] | None = None,
                **kwargs: Any) -> HttpAnswer:
    request = kserve_request(inputs, binary=binary, **kwargs)
    where = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
    return _http(ends, f"{where}/infer", "POST", request.body, {**request.headers, **(headers or {})})


def _grpc(ends: Ends, method: str, request: Message | bytes,
          metadata: Sequence[tuple[str, str]] = ()) -> GrpcAnswer:
    data = request if isinstance(request, bytes) else request.SerializeToString()
    try:
        ends.channel.unary_unary(SERVICE + method)(data, metadata=tuple(metadata), timeout=30)
    except grpc.RpcError as exc:
        return exc.code().name, exc.details() or ""
    return "OK", ""


def _infer_grpc(ends: Ends, request: pb.ModelInferRequest, metadata: Sequence[tuple[str, str]] = ()) -> GrpcAnswer:
    return _grpc(ends, "ModelInfer", request, metadata)


def _inputs() -> dict[str, np.ndarray]:
    return random_inputs(8, 8, 64, 1, 2, start=11)


def _with(**changes: np.ndarray) -> dict[str, np.ndarray]:
    return {**_inputs(), **changes}


def _without(name: str) -> dict[str, np.ndarray]:
    return {k: v for k, v in _inputs().items() if k != name}


def _renamed(old: str, new: str) -> dict[str, np.ndarray]:
    return {(new if k == old else k): v for k, v in _inputs().items()}


# -- requests a test means to be odd, written by hand on each side

def _http_short_binary(ends: Ends) -> HttpAnswer:
    """query declared [1, 8, 2, 64] FP32 (4096 bytes), sent with 2048 bytes (its binary_data_size says so)."""
    inputs = _inputs()
    header = kserve_request(inputs).header
    header["inputs"][0]["parameters"]["binary_data_size"] = 2048
    arrays = [inputs["query"].ravel()[:512], inputs["key"], inputs["value"], inputs["position_ids"]]
    request = request_with_header(header, arrays)
    return _http(ends, f"/v2/models/{MODEL}/infer", "POST", request.body, request.headers)


def _grpc_short_raw(ends: Ends) -> GrpcAnswer:
    request = grpc_infer_request(_inputs(), MODEL)
    request.raw_input_contents[0] = request.raw_input_contents[0][:2048]
    return _infer_grpc(ends, request)


def _http_short_json(ends: Ends) -> HttpAnswer:
    """query declared [1, 8, 2, 64] (1024 elements), sent as JSON `data` with 512."""
    header = kserve_request(_inputs(), binary=False).header
    header["inputs"][0]["data"] = header["inputs"][0]["data"][:512]
    return _http(ends, f"/v2/models/{MODEL}/infer", "POST", json.dumps(header).encode())


def _grpc_short_contents(ends: Ends) -> GrpcAnswer:
    """The same over gRPC: typed contents (`fp32_contents`, `int64_contents`), query's cut to 512 values."""
    request = pb.ModelInferRequest(model_name=MODEL)
    for name, array in _inputs().items():
        tensor = request.inputs.add(name=name, datatype="FP32" if array.dtype == np.float32 else "INT64",
                                    shape=array.shape)
        values = array.ravel().tolist()[:512] if name == "query" else array.ravel().tolist()
        if array.dtype == np.float32:
            tensor.contents.fp32_contents.extend(values)
        else:
            tensor.contents.int64_contents.extend(values)
    return _infer_grpc(ends, request)


def _http_duplicate_input(ends: Ends) -> HttpAnswer:
    inputs = _inputs()
    header = kserve_request(inputs).header
    header["inputs"].append(dict(header["inputs"][0]))
    request = request_with_header(header, [*inputs.values(), inputs["query"]])
    return _http(ends, f"/v2/models/{MODEL}/infer", "POST", request.body, request.headers)


def _grpc_duplicate_input(ends: Ends) -> GrpcAnswer:
    inputs = _inputs()
    request = grpc_infer_request(inputs, MODEL)
    request.inputs.add().CopyFrom(request.inputs[0])
    request.raw_input_contents.append(inputs["query"].tobytes())
    return _infer_grpc(ends, request)


def _grpc_unknown_output(ends: Ends) -> GrpcAnswer:
    request = grpc_infer_request(_inputs(), MODEL)
    request.outputs.add(name="scores")
    return _infer_grpc(ends, request)


def _grpc_versioned(ends: Ends, version: str) -> GrpcAnswer:
    request = grpc_infer_request(_inputs(), MODEL)
    request.model_version = version
    return _infer_grpc(ends, request)


def _grpc_shared_memory_request() -> pb.ModelInferRequest:
    """query from region 'r' (4096 bytes at 0), the others raw: over TCP without the shared-memory key."""
    request = grpc_infer_request(_without("query"), MODEL)
    query = pb.ModelInferRequest.InferInputTensor(name="query", datatype="FP32", shape=[1, 8, 2, 64])
    query.parameters["shared_memory_region"].string_param = "r"
    query.parameters["shared_memory_byte_size"].int64_param = 4096
    request.inputs.insert(0, query)
    return request


def _large() -> dict[str, np.ndarray]:
    return random_inputs(8, 8, 64, 1, 300)  # 3 × 614400 bytes of float32 and 2400 of int64: over 1 MiB


MISSING_OBJECT = f"/posenc_parity_absent_{os.getpid()}_{uuid.uuid4().hex[:8]}"  # no such object in /dev/shm


# -- normalising the one part that legitimately differs: the protocol's own name of what was called


def _route_to_method(route: str, method: str) -> Callable[[str], str]:
    """A restricted group's 403 names the HTTP route on one side and the gRPC method on the other
    (`<route or method> is in the restricted protocol group ...`): compare with that name replaced, the rest exactly."""

    def normalise(text: str) -> str:
        return text.replace(route, "<call>").replace(f"{SERVICE.rstrip('/')}/{method}", "<call>")

    return normalise


def _bytes_field(text: str) -> str:
    return text.replace("binary_data_size", "<bytes>").replace("raw_input_contents[0]", "<bytes>")


@dataclass(frozen=True)
class Case:
    id: str
    http: Callable[[Ends], HttpAnswer]
    grpc: Callable[[Ends], GrpcAnswer]
    normalise: Callable[[str], str] | None = None  # applied to both texts before comparing them
    text: bool = True  # False: the code only (the gRPC library answers with its own text)
    xfail: str | None = None


CASES = [
    Case("infer-unknown-model",
         lambda e: _infer_http(e, _inputs(), model="no_such_model"),
         lambda e: _infer_grpc(e, grpc_infer_request(_inputs(), "no_such_model"))),
    Case("infer-unknown-version",
         lambda e: _infer_http(e, _inputs(), version="7"),
         lambda e: _grpc_versioned(e, "7")),
    Case("infer-wrong-input-name",
         lambda e: _infer_http(e, _renamed("query", "queries"), binary=False),
         lambda e: _infer_grpc(e, grpc_infer_request(_renamed("query", "queries"), MODEL))),
    Case("infer-missing-input",
         lambda e: _infer_http(e, _without("position_ids")),
         lambda e: _infer_grpc(e, grpc_infer_request(_without("position_ids"), MODEL))),
    Case("infer-wrong-datatype",
         lambda e: _infer_http(e, _with(position_ids=_inputs()["position_ids"].astype(np.int32)), binary=False),
         lambda e: _infer_grpc(e, grpc_infer_request(_with(position_ids=_inputs()["position_ids"].astype(np.int32)),
                                                     MODEL))),
    Case("infer-wrong-rank",
         lambda e: _infer_http(e, _with(query=np.zeros((8, 2, 64), np.float32))),
         lambda e: _infer_grpc(e, grpc_infer_request(_with(query=np.zeros((8, 2, 64), np.float32)), MODEL))),
    # the size check names the field that carries the bytes, each protocol's own: `binary_data_size` (HTTP's binary
    # extension) or `raw_input_contents[0]` (gRPC): compare with that name replaced, the rest exactly
    Case("infer-binary-length-mismatch", _http_short_binary, _grpc_short_raw, normalise=_bytes_field),
    Case("infer-json-length-mismatch", _http_short_json, _grpc_short_contents),
    Case("infer-unknown-output",
         lambda e: _infer_http(e, _inputs(), outputs=["scores"]),
         _grpc_unknown_output),
    Case("infer-duplicate-input", _http_duplicate_input, _grpc_duplicate_input),
    # gRPC refuses a message over its receive limit (max_request_bytes) itself, with RESOURCE_EXHAUSTED and the
    # library's own text ("Received message larger than max ..."), before posenc sees it: the code only
    Case("infer-over-byte-limit",
         lambda e: _infer_http(e, _large()),
         lambda e: _infer_grpc(e, grpc_infer_request(_large(), MODEL)), text=False),
    Case("infer-shared-memory-without-key",
         lambda e: _infer_http(e, {"query": SharedMemoryInput(np.dtype(np.float32), (1, 8, 2, 64),
                                                               SharedMemory("r", 4096)),
                                   **_without("query")}),
         lambda e: _infer_grpc(e, _grpc_shared_memory_request())),
    Case("metadata-unknown-version",
         lambda e: _http(e, f"/v2/models/{MODEL}/versions/7"),
         lambda e: _grpc(e, "ModelMetadata", pb.ModelMetadataRequest(name=MODEL, version="7"))),
    Case("ready-unknown-model",
         lambda e: _http(e, "/v2/models/no_such_model/ready"),
         lambda e: _grpc(e, "ModelReady", pb.ModelReadyRequest(name="no_such_model"))),
    # a restricted group's 403 names what was called: the route over HTTP, the method over gRPC
    Case("statistics-without-key",
         lambda e: _http(e, f"/v2/models/{MODEL}/stats"),
         lambda e: _grpc(e, "ModelStatistics", pb.ModelStatisticsRequest(name=MODEL)),
         normalise=_route_to_method(f"/v2/models/{MODEL}/stats", "ModelStatistics")),
    Case("config-with-a-wrong-key",
         lambda e: _http(e, f"/v2/models/{MODEL}/config", headers={ADMIN_HEADER: "guess"}),
         lambda e: _grpc(e, "ModelConfig", pb.ModelConfigRequest(name=MODEL), [(ADMIN_HEADER, "guess")]),
         normalise=_route_to_method(f"/v2/models/{MODEL}/config", "ModelConfig")),
    # shared memory over TCP without its key: the 403 names the route or the method likewise
    Case("shared-memory-register-without-key",
         lambda e: _http(e, "/v2/systemsharedmemory/region/r/register", "POST",
                         json.dumps({"key": MISSING_OBJECT, "offset": 0, "byte_size": 64}).encode()),
         lambda e: _grpc(e, "SystemSharedMemoryRegister",
                         pb.SystemSharedMemoryRegisterRequest(name="r", key=MISSING_OBJECT, byte_size=64)),
         normalise=_route_to_method("/v2/systemsharedmemory/region/r/register", "SystemSharedMemoryRegister")),
    Case("shared-memory-register-missing-object",
         lambda e: _http(e, "/v2/systemsharedmemory/region/r/register", "POST",
                         json.dumps({"key": MISSING_OBJECT, "offset": 0, "byte_size": 64}).encode(), SHM),
         lambda e: _grpc(e, "SystemSharedMemoryRegister",
                         pb.SystemSharedMemoryRegisterRequest(name="r", key=MISSING_OBJECT, byte_size=64),
                         list(SHM.items()))),
    Case("shared-memory-status-unknown-region",
         lambda e: _http(e, "/v2/systemsharedmemory/region/no_such_region/status", headers=SHM),
         lambda e: _grpc(e, "SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="no_such_region"),
                         list(SHM.items()))),
    Case("restriction-key-sent-twice",
         lambda e: _http_pairs(e, f"/v2/models/{MODEL}/stats", [(ADMIN_HEADER, ADMIN_KEY), (ADMIN_HEADER, "x")]),
         lambda e: _grpc(e, "ModelStatistics", pb.ModelStatisticsRequest(name=MODEL),
                         [(ADMIN_HEADER, ADMIN_KEY), (ADMIN_HEADER, "x")])),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.xfail)]
                                               if c.xfail else []) for c in CASES])
def test_the_same_refusal_on_both_protocols(ends: Ends, case: Case) -> None:
    status, error = case.http(ends)
    code, details = case.grpc(ends)
    assert 400 <= status < 600, (status, error)
    assert code == GRPC_CODE_NAMES[status], f"HTTP {status} {error!r} but gRPC {code} {details!r}"
    assert error and details
    if case.text:
        normalise = case.normalise or (lambda text: text)
        assert normalise(error) == normalise(details), f"HTTP: {error!r}\ngRPC: {details!r}"


def test_twenty_cases_and_the_server_still_serves(ends: Ends) -> None:
    assert len(CASES) == 20 and len({c.id for c in CASES}) == 20
    request = grpc_infer_request(_inputs(), MODEL)
    assert _infer_grpc(ends, request) == ("OK", "")
    assert http_request(ends.server.port, "/v2/health/ready", host=ends.server.host)[0] == 200
