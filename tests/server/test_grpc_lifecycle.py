"""The gRPC server's life with `posenc serve`: a taken port is a start-up failure that says so, SIGTERM drains the
calls in flight and exits 0, POSENC_GRPC_PORT=0 serves no gRPC."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator

import grpc
from tritonclient.grpc import service_pb2 as pb

from posenc.service.serving.server import EXIT_STARTUP_FAILURE
from posenc.service.testing import ServerProcess
from tests.onnx_models import grpc_infer_request, random_inputs

SERVICE = "/inference.GRPCInferenceService/"


def test_a_taken_grpc_port_is_a_startup_failure_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ServerProcess({"grpc_port": port, "log_level": "warning"}, ready=None).start()
        try:
            assert server.wait(90) == EXIT_STARTUP_FAILURE
        finally:
            server.stop()
    assert f"gRPC cannot listen on 127.0.0.1:{port} (POSENC_GRPC_PORT; 0 turns gRPC off)" in server.log()


def test_sigterm_drains_a_stream_in_flight_and_exits_0() -> None:
    data = grpc_infer_request(random_inputs(8, 8, 64, 4, 256), "rope_attention").SerializeToString()
    with ServerProcess({"log_level": "warning"}, grpc=True) as server, \
            grpc.insecure_channel(server.grpc_address) as channel:
        sent = threading.Event()

        def requests() -> Iterator[bytes]:
            for index in range(6):
                yield data
                if index == 0:
                    sent.set()

        answers = channel.stream_stream(SERVICE + "ModelStreamInfer")(requests(), timeout=120)
        first = next(answers)
        assert sent.wait(10)
        server.send_signal(signal.SIGTERM)
        rest = list(answers)
        assert server.wait(60) == 0
    responses = [pb.ModelStreamInferResponse.FromString(a) for a in [first, *rest]]
    assert len(responses) == 6 and not any(r.error_message for r in responses)


def test_grpc_port_0_serves_no_grpc() -> None:
    """The kit's default (POSENC_GRPC_PORT=0): no gRPC server starts; with a port, its start is logged."""
    with ServerProcess({"log_level": "info"}) as off, ServerProcess({"log_level": "info"}, grpc=True) as on:
        assert off.grpc_port == 0 and on.grpc_port != 0
        assert "gRPC (KServe v2 / Triton, health, reflection) on" not in off.log()
        assert f"gRPC (KServe v2 / Triton, health, reflection) on 127.0.0.1:{on.grpc_port}" in on.log()
