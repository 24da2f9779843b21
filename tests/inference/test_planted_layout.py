"""Two planted bugs the suite missed: a CPU rule kept although a graph it names was never written, and gRPC's
port shared (SO_REUSEPORT) by a server of one worker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.onnx_models import REPOSITORY

pytest.importorskip("onnx")


def test_a_rule_naming_a_graph_never_written_is_not_kept(tmp_path: Path) -> None:
    from posenc.models.export.cpu_forms import write_cpu_forms

    folder = tmp_path / "rope_attention"
    folder.mkdir()
    for name in ("model.onnx", "config.json"):
        shutil.copy(REPOSITORY / "rope_attention" / name, folder / name)
    write_cpu_forms(folder, rule=[(1, "model.onnx"), (64, "model.blocked32.onnx")])  # no 32-block form is written
    config = json.loads((folder / "config.json").read_text())
    assert not (folder / "model.blocked32.onnx").exists()
    assert config["cpu_forms"] and config["cpu_rule"] is None
    write_cpu_forms(folder, rule=[(1, "model.onnx"), (64, "model.blocked4.onnx")])  # a graph it wrote: kept
    assert json.loads((folder / "config.json").read_text())["cpu_rule"] == [
        {"from_sequence": 1, "file": "model.onnx"}, {"from_sequence": 64, "file": "model.blocked4.onnx"}]


@pytest.mark.parametrize(("workers", "reuse"), [(1, 0), (2, 1)])
def test_grpc_shares_its_port_only_between_workers(monkeypatch: pytest.MonkeyPatch, workers: int, reuse: int) -> None:
    """One worker: SO_REUSEPORT off, so a second server on the same port fails to start instead of splitting the
    port's calls with a stranger; several workers: on, so they share the port."""
    import asyncio

    import grpc

    from posenc.service.grpc import server as grpc_server

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def server(*args: Any, options: list[tuple[str, Any]], **kwargs: Any) -> Any:
        seen.update(options)
        raise Stop

    monkeypatch.setattr(grpc.aio, "server", server)
    settings = type("S", (), {"max_request_bytes": 1 << 20, "grpc_max_concurrent_rpcs": 256})()
    state: Any = type("State", (), {"settings": settings})()
    with pytest.raises(Stop):
        asyncio.run(grpc_server.start_grpc_server(state, lambda *args: None, workers=workers))
    assert seen["grpc.so_reuseport"] == reuse
