"""The peers of `bench infer` (bench/peers.py, bench/peer_columns.py, bench/clients.py): their pins, the ratios and
table, LitServe's request format, and a peer that is missing reported as a row rather than a crash. The tests that
start a peer run only where its virtual environment exists (`python -m bench infer` makes it)."""

from __future__ import annotations

import json
import math
import types
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest

from bench import peer_columns, peers
from bench.clients import Endpoint, crowd_rate, endpoint_call
from bench.harness import ROOT, Servers, inputs
from bench.isolation import plan_cores
from bench.peer_columns import (
    CLIENTS,
    SIDES,
    PeerColumns,
    PeerResult,
    format_peer_table,
    latency_ratio,
    rate_ratio,
    result_rows,
)
from bench.peer_onnx import SHAPE_HEADER, OnnxGraphs, litserve_body, litserve_inputs, litserve_output, parse_model_dir
from bench.peers import KSERVE, LITSERVE, PYTRITON, peer_python


def _pins(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def test_each_peer_is_pinned_in_a_requirement_file_of_its_own() -> None:
    assert _pins(PYTRITON.requirements) == ["nvidia-pytriton==0.7.*"]
    assert _pins(LITSERVE.requirements) == ["litserve==0.2.*"]
    assert _pins(KSERVE.requirements) == ["kserve==0.21.0"]
    assert {peer.venv.name for peer in (KSERVE, PYTRITON, LITSERVE)} == {
        ".venv-bench-kserve", ".venv-bench-pytriton", ".venv-bench-litserve"}
    assert all(peer.venv.parent == ROOT for peer in (KSERVE, PYTRITON, LITSERVE))
    assert PYTRITON.variable == "BENCH_PYTRITON_PYTHON"


@pytest.mark.parametrize("peer", [PYTRITON, LITSERVE, KSERVE], ids=lambda peer: peer.key)
def test_a_peer_that_is_not_installed_says_why_and_a_named_interpreter_is_never_made(
        peer: peers.Peer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(peer.variable, str(tmp_path / "missing" / "python"))
    python, why = peer_python(peer, create=True)
    assert python is None and f"no {peer.module} at" in why
    assert not (tmp_path / "missing").exists()


def test_ratios_are_posenc_over_the_peer_higher_is_better() -> None:
    assert latency_ratio(2.0, 3.0) == pytest.approx(1.5)  # 1 client: the peer's ms over posenc's
    assert rate_ratio(300.0, 200.0) == pytest.approx(1.5)  # 8 clients: posenc's req/s over the peer's
    assert math.isnan(latency_ratio(math.nan, 3.0)) and math.isnan(rate_ratio(300.0, 0.0))


def test_a_crowds_rate_sums_each_clients_own_rate() -> None:
    # a client that ends its last call past the round is counted by its own span, not cut to a fraction
    assert crowd_rate([(3, 1.5), (2, 1.0)]) == pytest.approx(4.0)
    assert crowd_rate([(0, 1.0), (4, 2.0)]) == pytest.approx(2.0)


def test_the_targets_are_the_issues_per_protocol_and_the_rows_judge_both_client_counts() -> None:
    targets = {(side.peer.name, side.protocol): side.target for side in SIDES}
    assert targets == {("PyTriton", "HTTP"): 1.5, ("PyTriton", "gRPC"): 1.3, ("LitServe", "HTTP"): None}
    http, grpc = SIDES[0], SIDES[1]
    case = ("rope_attention", 4, 256)
    single, crowd = result_rows(PeerResult(http, case, posenc_ms=10.0, peer_ms=16.0, posenc_rps=90.0, peer_rps=60.0))
    assert (single.ratio, single.status, single.unit) == (pytest.approx(1.6), "PASS", "ms")
    assert (crowd.ratio, crowd.status, crowd.unit) == (pytest.approx(1.5), "PASS", "req/s")
    assert f"{CLIENTS} clients" in crowd.what and "PyTriton HTTP" in crowd.what
    below = result_rows(PeerResult(grpc, case, posenc_ms=10.0, peer_ms=12.0, posenc_rps=90.0, peer_rps=80.0))
    assert [row.status for row in below] == ["BELOW", "BELOW"]
    noisy = result_rows(PeerResult(grpc, case, 10.0, 14.0, 90.0, 60.0), control=1.0, crowd_control=1.2)
    assert [row.status for row in noisy] == ["PASS", "NOISY"]  # the crowd's control: two posenc HTTP sides
    litserve = result_rows(PeerResult(SIDES[2], case, 10.0, 50.0, 90.0, 20.0))
    assert [row.status for row in litserve] == ["info", "info"]


def test_the_table_names_the_cpu_and_a_peer_not_measured_is_a_row_with_its_reason() -> None:
    results = [PeerResult(SIDES[0], ("rope_attention", 1, 128), 2.0, 3.1, 400.0, 250.0),
               PeerResult(SIDES[1], ("rope_attention", 1, 128), 2.0, 2.2, 400.0, 390.0),
               PeerResult(SIDES[2], why="could not install litserve-requirements.txt")]
    table = format_peer_table("AMD EPYC 9R14", "servers on CPU 0, clients on CPU 1", results)
    lines = table.splitlines()
    assert "AMD EPYC 9R14" in lines[0] and "ratio = posenc / peer" in lines[0]
    assert len({line.count("|") for line in lines[1:]}) == 1  # every row fills the header's columns
    assert "| 1.55 ✓ |" in lines[3] and "| 1.60 ✓ |" in lines[3] and "≥ 1.5" in lines[3]
    assert "| 1.10 ✗ |" in lines[4] and "| 1.03 ✗ |" in lines[4] and "≥ 1.3" in lines[4]
    assert "not measured: could not install litserve-requirements.txt" in lines[5]
    row, = result_rows(results[2])
    assert row.status == "info" and "could not install" in row.note and "LitServe" in row.what


def test_litserves_request_carries_each_input_as_base64_and_its_answer_is_raw_bytes() -> None:
    arrays = inputs(2, 16)
    decoded = litserve_inputs(json.loads(litserve_body(arrays)))
    assert decoded.keys() == arrays.keys()
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)
        assert decoded[name].dtype == array.dtype
    output = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(litserve_output(output.tobytes(), {SHAPE_HEADER: "2,3,4"}), output)


def test_a_peer_runs_the_graph_of_the_rule_it_is_given() -> None:
    folder = ROOT / "onnx" / "rope_attention"
    assert parse_model_dir(str(folder)) == (folder, [])
    two = [(1, "model.onnx"), (300, "model.onnx")]
    assert parse_model_dir(f"{folder}@model.onnx:1,model.onnx:300") == (folder, two)
    graphs = OnnxGraphs(f"{folder}@model.onnx:1", 1)
    assert graphs.name == "rope_attention"
    arrays = inputs(1, 16)
    assert graphs.run(arrays).shape == arrays["query"].shape
    assert Endpoint("grpc", "127.0.0.1:8001").host_port() == ("127.0.0.1", 8001)


def test_peers_that_cannot_be_had_leave_rows_with_the_reason_and_start_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(peer_columns, "peer_python", lambda peer, create: (None, f"no {peer.module} here"))
    servers = Servers(tmp_path, plan_cores(False))
    columns = PeerColumns(servers, plan_cores(False), ["rope_attention"], 1, {PYTRITON: None, LITSERVE: False},
                          quick=True)
    try:
        assert servers.started == [] and columns.crowd is None and columns.live() == []
        assert columns.calls("rope_attention", inputs(1, 16), np.zeros(1)) == {}
        assert columns.measure(("rope_attention", 1, 16), types.SimpleNamespace(), {}, 1, 1.0, None) == []
        notes = [row.note for row in columns.rows_not_measured()]
        assert notes == ["not measured: no pytriton here"] * 2 + ["not measured: --no-litserve"]
        assert "PyTriton: not measured: no pytriton here" in columns.note()
        assert "not measured: --no-litserve" in columns.table(1)
    finally:
        columns.close()


@pytest.mark.parametrize("peer", [PYTRITON, LITSERVE], ids=lambda peer: peer.key)
def test_a_peer_answers_what_onnxruntime_answers(peer: peers.Peer, tmp_path: Path) -> None:
    """Starts the peer from its environment (skipped where `python -m bench infer` has not made it)."""
    python, why = peer_python(peer, create=False)
    if python is None:
        pytest.skip(why)
    cores = plan_cores(False)
    arrays = inputs(2, 64)
    expected = OnnxGraphs(str(ROOT / "onnx" / "rope_attention"), 1).run(arrays)
    start = peers.start_pytriton if peer is PYTRITON else peers.start_litserve
    with Servers(tmp_path, cores) as servers, ExitStack() as stack:
        server = start(servers, python, ["rope_attention"], 1)
        endpoints = ([Endpoint("http", server.address), Endpoint("grpc", server.grpc_address)] if peer is PYTRITON
                     else [Endpoint("litserve", server.address)])
        for endpoint in endpoints:
            call = endpoint_call(endpoint, "rope_attention", arrays, stack)
            np.testing.assert_allclose(call(), expected, atol=1e-4, rtol=1e-4)


def test_a_peer_that_does_not_start_is_a_row_with_its_logs_tail(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    def not_ready(*args: object) -> None:
        raise RuntimeError("PyTriton on port 1 not ready on /v2/models/rope_attention/ready (exited with 1); log tail:"
                           "\n  libpython3.11.so.1.0: cannot open shared object file")

    monkeypatch.setattr(peer_columns, "peer_python", lambda peer, create: (Path("/usr/bin/python3"), ""))
    monkeypatch.setattr(peer_columns, "start_pytriton", not_ready)
    columns = PeerColumns(Servers(tmp_path, plan_cores(False)), plan_cores(False), ["rope_attention"], 1,
                          {PYTRITON: True, LITSERVE: False}, quick=False)
    try:
        reasons = {result.side.key: result.why for result in columns.results}
        assert "not ready" in reasons["pytriton http"] and "cannot open shared object" in reasons["pytriton grpc"]
        assert "\n" not in reasons["pytriton http"] and columns.live() == [] and columns.crowd is None
    finally:
        columns.close()
