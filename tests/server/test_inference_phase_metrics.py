"""Every inference's server-side time by phase in `/metrics`, as Triton exports its own (cumulative microseconds per
model beside a count, `nv_inference_request_duration_us` and its phases): over HTTP and over gRPC on one live
`posenc serve`, whether or not POSENC_SERVER_TIMING sends them to the client too."""

from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import pytest

from posenc.service.request_kit.phases import ORDER
from posenc.service.testing import ServerProcess, attention_inputs, http_request, kserve_request
from tests.onnx_models import grpc_infer_request

MODEL = "rope_attention"
INFER = "/inference.GRPCInferenceService/ModelInfer"
SAMPLE = re.compile(r'^(posenc_inference_\w+)\{([^}]*)\} ([0-9.e+-]+)$', re.M)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with ServerProcess({"log_level": "warning"}, grpc=True) as process:
        yield process


def _samples(server: ServerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    status, _, text = http_request(server.port, "/metrics", timeout=30, host=server.host)
    assert status == 200
    return {(name, frozenset(tuple(pair.split("=", 1)) for pair in labels.replace('"', "").split(","))): float(value)
            for name, labels, value in SAMPLE.findall(text.decode())}


def _value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_each_protocol_counts_its_inferences_by_phase(server: ServerProcess) -> None:
    inputs = attention_inputs(8, 8, 64, 1, 16)
    request = kserve_request(inputs)
    for _ in range(2):
        status, _, _ = http_request(server.port, f"/v2/models/{MODEL}/infer", "POST", request.body, request.headers,
                                    timeout=30, host=server.host)
        assert status == 200
    with grpc.insecure_channel(server.grpc_address) as channel:
        for _ in range(3):
            channel.unary_unary(INFER)(grpc_infer_request(inputs, MODEL).SerializeToString(), timeout=30)
    samples = _samples(server)
    for protocol, count in (("http", 2), ("grpc", 3)):
        assert _value(samples, "posenc_inference_requests_total", model=MODEL, protocol=protocol) == count
        total = _value(samples, "posenc_inference_request_duration_us_total", model=MODEL, protocol=protocol)
        phases = {phase: _value(samples, "posenc_inference_phase_duration_us_total", model=MODEL, protocol=protocol,
                                phase=phase) for phase in ORDER}
        measured = ("admit", "read", "parse", "queue", "run", "encode") + (("route",) if protocol == "http" else ())
        assert all(phases[phase] > 0 for phase in measured), (protocol, phases)
        assert sum(phases.values()) <= total * 1.001, (protocol, phases, total)
        assert _value(samples, "posenc_inference_phase_seconds_count", protocol=protocol, phase="run") == count
