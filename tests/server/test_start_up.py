"""A first start as the server makes it: the port opens before the models are loaded, a model is ready once its
CPU graphs are calibrated (in a child process), the idle process after that first start is the size of a start
from the cache, gRPC's health follows, and a stop during the calibration leaves no child behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import grpc
import pytest

from posenc.service.testing import ServerProcess, http_request

MiB = 1024 * 1024
MODELS = ("qwen2_5_7b_attention", "rope_attention")  # calibrated in about 2 and 5 s on two cores


def _repository(tmp_path: Path) -> Path:
    from tests.onnx_models import REPOSITORY

    for model in MODELS:
        shutil.copytree(REPOSITORY / model, tmp_path / "repo" / model)
    return tmp_path / "repo"


def _settings(tmp_path: Path) -> dict[str, object]:
    return {"model_repository": _repository(tmp_path), "cpu_form_from": "calibrate", "log_level": "info",
            "calibration_cache": tmp_path / "cache" / "calibration.json", "intra_op_num_threads": 2,
            "access_log": False}


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _children(pid: int) -> list[int]:
    """The child processes of `pid`, whichever of its threads started them."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the thread has ended
            children += [int(child) for child in (task / "children").read_text().split()]
    return children


def _wait_for_port(port: int, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return time.monotonic() - start
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"port {port} not open after {seconds} s")


def _health(address: str, service: str) -> int:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(answer.status)


def test_a_first_start_listens_at_once_then_calibrates_without_keeping_its_memory(tmp_path: Path) -> None:
    from grpc_health.v1 import health_pb2

    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    settings = _settings(tmp_path)
    with ServerProcess(settings, ready=None, grpc=True) as first:
        # the port opens while the models load (the import of the server itself takes most of it)
        assert _wait_for_port(first.port, 10) < 10
        assert http_request(first.port, "/v1/rope?max_position=4&head_dim=8")[0] == 200
        status, _, body = http_request(first.port, "/readyz")
        assert status == 503 and b"loading" in body, body
        assert _health(first.grpc_address, "inference.GRPCInferenceService") == not_serving
        # a calibration child runs while the models load (between two models' children, briefly none)
        deadline = time.monotonic() + 10
        while not _children(first.pid):
            assert time.monotonic() < deadline, "no calibration child while loading"
            time.sleep(0.02)
        deadline = time.monotonic() + 90
        while http_request(first.port, "/readyz")[0] != 200:
            assert time.monotonic() < deadline, first.log()
            time.sleep(0.2)
        assert _health(first.grpc_address, "inference.GRPCInferenceService") == serving
        assert _health(first.grpc_address, "rope_attention") == serving
        time.sleep(1)
        after_calibration = _rss(first.pid)
        log = first.log()
    assert log.count("calibrated on this machine") == len(MODELS), log
    assert "calibration child" in log and "peak" in log
    with ServerProcess(settings, ready="/readyz", ready_timeout=60) as again:
        time.sleep(1)
        from_cache = _rss(again.pid)
        assert "calibrated earlier on this machine (cache)" in again.log()
    # the serving process keeps nothing of the timings: the same size as a start from the cache
    assert abs(after_calibration - from_cache) < 150 * MiB, (after_calibration / MiB, from_cache / MiB)


def test_a_stop_during_the_calibration_leaves_no_child(tmp_path: Path) -> None:
    settings = {**_settings(tmp_path), "calibration_seconds": 600, "intra_op_num_threads": 1}
    server = ServerProcess(settings, ready=None)
    with server:
        _wait_for_port(server.port, 10)
        deadline = time.monotonic() + 10
        while not (children := _children(server.pid)):
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        server.send_signal(signal.SIGTERM)
        # stopped (cleanly) although the calibration had 600 s left: the child was not waited for
        assert server.wait(15) == 0, server.log()
    for child in children:
        assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_a_killed_server_takes_its_calibration_child_with_it(tmp_path: Path) -> None:
    settings = {**_settings(tmp_path), "calibration_seconds": 600, "intra_op_num_threads": 1}
    with ServerProcess(settings, ready=None) as server:
        _wait_for_port(server.port, 10)
        deadline = time.monotonic() + 10
        while not (children := _children(server.pid)):
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        os.kill(server.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(Path(f"/proc/{child}").exists() for child in children):
            assert time.monotonic() < deadline, "the calibration child outlived its server"
            time.sleep(0.05)


@pytest.mark.parametrize("threads", [2])
def test_the_cache_written_by_a_first_start_is_private(tmp_path: Path, threads: int) -> None:
    settings = {**_settings(tmp_path), "intra_op_num_threads": threads}
    with ServerProcess(settings, ready="/readyz", ready_timeout=90):
        pass
    folder = tmp_path / "cache"
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert oct((folder / "calibration.json").stat().st_mode & 0o777) == "0o600"
