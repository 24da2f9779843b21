"""A gRPC call cut by POSENC_GRACEFUL_SHUTDOWN_TIMEOUT counts as cut (`posenc.service.serving.server.GrpcCuts`): the
process exits 1 as the docs say (it exited 0), a WARNING names the call, and the access log records what its client
got, UNAVAILABLE (it recorded CANCELLED)."""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from posenc.service.testing import ServerProcess, http_request
from tests.onnx_models import grpc_infer_request, random_inputs

SERVICE = "/inference.GRPCInferenceService/"
QUEUE_DELAY_US = 10_000_000  # the first request of a batch waits this long for others: in flight at the signal
QUEUED = b'posenc_queue_depth{model="rope_attention"} 1.0'


@pytest.mark.timeout(120)
def test_a_model_infer_cut_at_the_graceful_timeout_exits_1_and_is_named() -> None:
    data = grpc_infer_request(random_inputs(8, 8, 64, 1, 16), "rope_attention").SerializeToString()
    settings = {"log_level": "info", "access_log": True, "graceful_shutdown_timeout": 0.5,
                "max_queue_delay_us": QUEUE_DELAY_US}
    with ServerProcess(settings, grpc=True) as server, grpc.insecure_channel(server.grpc_address) as channel:
        call = channel.unary_unary(SERVICE + "ModelInfer").future(data, timeout=60)
        while QUEUED not in http_request(server.port, "/metrics")[2]:  # the call waits in its model's batcher
            time.sleep(0.05)
        server.send_signal(signal.SIGTERM)
        with pytest.raises(grpc.RpcError) as cut:
            call.result()
        status = server.wait(30)
    log = server.log()
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
    assert status == 1, log[-2000:]
    assert "POSENC_GRACEFUL_SHUTDOWN_TIMEOUT): gRPC ModelInfer from ipv4:127.0.0.1:" in log
    assert "GRPC /inference.GRPCInferenceService/ModelInfer UNAVAILABLE" in log
