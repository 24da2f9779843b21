"""What a gRPC call leaves behind: its access-log line (text and JSON) and its metrics by method and code."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from posenc.service.grpc.server import grpc_recorder
from posenc.service.http.logs import JsonFormatter
from posenc.service.metrics import Metrics


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def access_records() -> Iterator[list[logging.LogRecord]]:
    """The access log's records, read at the logger itself: a test before this one in the same process may have
    configured logging (posenc's loggers do not propagate to the root, where pytest's caplog listens)."""
    logger, handler = logging.getLogger("posenc.access"), _Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_grpc_call_is_logged_and_counted() -> None:
    metrics = Metrics()
    record = grpc_recorder(metrics, access_log_enabled=True)
    with access_records() as records:
        record("ModelInfer", "NOT_FOUND", 0.0123, 0, "ipv4:127.0.0.1:5000")
        record("ModelInfer", "OK", 0.002, 65586, "ipv4:127.0.0.1:5000")
    first, second = records
    assert first.getMessage() == "GRPC /inference.GRPCInferenceService/ModelInfer NOT_FOUND 12.3ms 0B"
    document = json.loads(JsonFormatter().format(second))
    assert {k: document[k] for k in ("method", "path", "grpc_code", "bytes", "client")} == {
        "method": "GRPC", "path": "/inference.GRPCInferenceService/ModelInfer", "grpc_code": "OK", "bytes": 65586,
        "client": "ipv4:127.0.0.1:5000"}
    text = metrics.exposition().decode()
    assert 'posenc_grpc_requests_total{code="NOT_FOUND",method="ModelInfer"} 1.0' in text
    assert 'posenc_grpc_request_duration_seconds_count{method="ModelInfer"} 2.0' in text


def test_the_access_log_setting_turns_grpc_lines_off() -> None:
    metrics = Metrics()
    with access_records() as records:
        grpc_recorder(metrics, access_log_enabled=False)("ServerLive", "OK", 0.001, 2, "")
    assert not records
    assert 'posenc_grpc_requests_total{code="OK",method="ServerLive"} 1.0' in metrics.exposition().decode()
