"""What a gRPC call leaves behind: its access-log line (text and JSON) and its metrics by method and code."""

from __future__ import annotations

import json
import logging

import pytest

from posenc.service.http.logs import JsonFormatter
from posenc.service.http.metrics import Metrics, RequestRecorder


def test_a_grpc_call_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    recorder = RequestRecorder(metrics)
    with caplog.at_level(logging.INFO, logger="posenc.access"):
        recorder.record_grpc("ModelInfer", "NOT_FOUND", 0.0123, 0, "ipv4:127.0.0.1:5000")
        recorder.record_grpc("ModelInfer", "OK", 0.002, 65586, "ipv4:127.0.0.1:5000")
    first, second = caplog.records
    assert first.getMessage() == "GRPC /inference.GRPCInferenceService/ModelInfer NOT_FOUND 12.3ms 0B"
    document = json.loads(JsonFormatter().format(second))
    assert {k: document[k] for k in ("method", "path", "grpc_code", "bytes", "client")} == {
        "method": "GRPC", "path": "/inference.GRPCInferenceService/ModelInfer", "grpc_code": "OK", "bytes": 65586,
        "client": "ipv4:127.0.0.1:5000"}
    text = metrics.exposition().decode()
    assert 'posenc_grpc_requests_total{code="NOT_FOUND",method="ModelInfer"} 1.0' in text
    assert 'posenc_grpc_request_duration_seconds_count{method="ModelInfer"} 2.0' in text


def test_the_access_log_setting_turns_grpc_lines_off(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    with caplog.at_level(logging.INFO, logger="posenc.access"):
        RequestRecorder(metrics, access_log_enabled=False).record_grpc("ServerLive", "OK", 0.001, 2, "")
    assert not caplog.records
    assert 'posenc_grpc_requests_total{code="OK",method="ServerLive"} 1.0' in metrics.exposition().decode()
