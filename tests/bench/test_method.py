"""The benchmark's method (bench/isolation.py): a control outside 3 % makes a row NOISY and `--check` say it is
too noisy to judge; the cores split in two sets; an anchor in its own process answers what it answers in-process."""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import bench.__main__ as entry
import bench.batching as batching
from bench import harness
from bench.harness import Report, Row, inputs
from bench.inprocess import graph_path, ort_session_at
from bench.isolation import RESOLUTION, AnchorProcess, Paired, cpu_isa, cpu_lines, paired, plan_cores
from bench.peers import kserve_python
from posenc.service.inference.runtime.calibration import ISA_FLAGS


@pytest.mark.parametrize(("control", "ratio", "status"), [
    (None, 1.2, "PASS"), (1.02, 1.2, "PASS"), (0.98, 0.9, "BELOW"), (1.05, 1.2, "NOISY"), (0.96, 0.9, "NOISY"),
])
def test_a_row_is_judged_only_when_its_control_agrees_within_3_percent(control: float | None, ratio: float,
                                                                        status: str) -> None:
    row = Row("x", ratio, 1.0, "req/s", True, target=1.0, control=control)
    assert row.status == status
    assert Row("x", ratio, 1.0, "req/s", True, control=1.5).status == "info"  # no target, nothing to judge


@pytest.mark.parametrize(("ratio", "error", "status"), [
    (0.98, 0.02, "NOISY"), (0.98, 0.004, "PASS"), (0.90, 0.02, "BELOW"), (1.00, 0.02, "NOISY"), (1.05, 0.02, "PASS"),
    (0.96, None, "BELOW"),
])
def test_a_row_is_judged_only_when_its_ratio_is_two_standard_errors_from_its_target(ratio: float,
                                                                                     error: float | None,
                                                                                     status: str) -> None:
    """A control is one draw of the noise: it can land near 1.0 in a run whose rounds range over ±20 %. A ratio
    that its own rounds cannot place on one side of the target is not judged either."""
    row = Row("x", 500.0, 600.0, "req/s", True, target=0.97, control=1.0, paired=Paired(ratio, error))
    assert (row.ratio, row.error, row.status) == (ratio, error, status)
    assert Row("x", 5.0, 6.0, "ms", False, paired=Paired(1.25, 0.01)).ratio == 0.8  # times: anchor over posenc


def test_a_paired_ratio_is_what_the_rounds_ratios_say_not_what_the_machine_drifts() -> None:
    drift = [700.0, 900.0, 520.0, 860.0, 610.0, 1000.0]  # a machine whose speed swings by half between rounds
    steady = paired([v * 0.98 for v in drift], drift)
    assert steady.ratio == pytest.approx(0.98)
    assert steady.error == pytest.approx(0.0, abs=1e-12)
    ratios = [1.05, 0.95, 1.02, 0.98, 1.0, 1.01]
    logs = np.sort(np.log(ratios))
    # six rounds: one left out at each end; the error from the winsorized spread (Tukey and McLaughlin)
    winsorized = np.clip(logs, logs[1], logs[4])
    noisy = paired([v * r for v, r in zip(drift, ratios, strict=True)], drift)
    assert noisy.ratio == pytest.approx(np.exp(logs[1:5].mean()))
    assert noisy.error == pytest.approx(np.std(winsorized, ddof=1) / ((1 - 2 / 6) * np.sqrt(6)))
    stalled = paired([v * r for v, r in zip(drift, [0.25, *ratios[1:]], strict=True)], drift)
    assert stalled.ratio == pytest.approx(noisy.ratio, rel=0.02)  # a stalled round is trimmed, not averaged in
    assert paired([1.0, 2.0], [1.0, 1.0]).error is None  # two rounds: no spread to read
    assert paired([1.0, 0.0, 2.0, 1.5], [1.0, 1.0, 1.0, 1.0]).error is not None  # a failed round is left out


def test_rounds_are_added_until_settled_or_at_most_and_the_order_keeps_alternating() -> None:
    calls: list[str] = []

    def side(name: str) -> Callable[[], str]:
        return lambda: calls.append(name) or name

    results = harness.interleaved_until(lambda done: len(done[0]) >= 5, 3, 9, 1, side("a"), side("b"))
    assert [len(r) for r in results] == [5, 5]
    assert "".join(calls) == "ab" "ba" "ab" "ba" "ab"  # the fourth round goes on from the third
    calls.clear()
    results = harness.interleaved_until(lambda done: False, 3, 8, 3, side("a"), side("b"))
    assert [len(r) for r in results] == [8, 8]  # never settled: stops at most, the last step cut to fit


def test_batching_goes_on_for_precision_never_for_the_verdict() -> None:
    """Whether `bench batching` adds rounds depends on how precise its ratios are, not on where they lie:
    stopping as soon as a ratio passes would favour a pass."""
    steady = [1000.0, 1010.0, 990.0, 1005.0, 995.0, 1000.0]
    swinging = [1000.0, 800.0, 1200.0, 900.0, 1150.0, 950.0]
    for on_over_off in (0.90, 1.0, 1.10):
        assert batching.precise([[v * on_over_off for v in steady], steady, [v * on_over_off for v in steady]])
        assert not batching.precise([[v * on_over_off for v in swinging], steady, [v * on_over_off for v in steady]])
    assert (paired(swinging, steady).error or 0) > RESOLUTION
    args = types.SimpleNamespace(quick=False, most_rounds=None)
    assert batching.most_rounds(args, 9) == 27
    assert batching.most_rounds(types.SimpleNamespace(quick=False, most_rounds=12), 9) == 12
    assert batching.most_rounds(types.SimpleNamespace(quick=False, most_rounds=4), 9) == 9  # never below --rounds
    assert batching.most_rounds(types.SimpleNamespace(quick=True, most_rounds=None), 2) == 2  # CI's quick run


def _run_with(monkeypatch: pytest.MonkeyPatch, rows: list[Row], *argv: str) -> int:
    fake = types.SimpleNamespace(run=lambda bench: Report(rows=rows))
    monkeypatch.setattr(entry.importlib, "import_module", lambda name: fake)
    monkeypatch.setattr(entry.signal, "signal", lambda *args: None)  # main's SIGTERM handler: not in pytest's process
    return entry.main(["tables", "--no-pin", *argv])


def test_check_fails_as_too_noisy_rather_than_passing_or_failing(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    noisy = Row("small table", 0.5, 1.0, "req/s", True, target=1.0, control=1.10)
    assert _run_with(monkeypatch, [noisy], "--check") == 3
    assert "too noisy to judge" in capsys.readouterr().out
    assert _run_with(monkeypatch, [noisy]) == 0  # without --check: printed, never failing
    below = Row("small table", 0.5, 1.0, "req/s", True, target=1.0, control=1.01)
    assert _run_with(monkeypatch, [below], "--check") == 1
    passing = Row("small table", 1.5, 1.0, "req/s", True, target=1.0, control=1.01)
    assert _run_with(monkeypatch, [passing], "--check") == 0
    capsys.readouterr()
    unresolved = Row("batching", 980, 1000, "req/s", True, target=0.97, control=1.0, paired=Paired(0.98, 0.03))
    assert _run_with(monkeypatch, [unresolved], "--check") == 3
    assert "two standard errors" in capsys.readouterr().out
    assert "0.980 ±3.0%" in harness.format_table([unresolved])


def test_a_sides_rounds_go_to_its_server_processes_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench batching` and `bench tables` average what one server process gains or loses by itself over
    several: round i of a side goes to its process i mod N, and rows per run sum over them."""
    side = [types.SimpleNamespace(name=f"on {i}", port=8000 + i) for i in range(3)]
    one_round = harness.in_turn(side, lambda port: port)
    assert [one_round() for _ in range(7)] == [8000, 8001, 8002, 8000, 8001, 8002, 8000]
    stats = {8000: (30, 20), 8001: (12, 12), 8002: (5, 5)}
    monkeypatch.setattr(batching, "model_stats", lambda port: stats[port])
    before = {"on 0": (10, 10), "on 1": (0, 0), "on 2": (5, 5)}
    assert batching.rows_per_run(side, before) == (20 + 12 + 0) / (10 + 12 + 0)
    quick = types.SimpleNamespace(replicas=None, quick=True)
    assert harness.replicas_of(quick) == 1
    assert harness.replicas_of(types.SimpleNamespace(replicas=None, quick=False)) == harness.REPLICAS
    assert harness.replicas_of(types.SimpleNamespace(replicas=2, quick=True)) == 2
    assert harness.load_rounds(types.SimpleNamespace(rounds=None, replicas=2, quick=False)) == 6
    assert harness.load_rounds(types.SimpleNamespace(rounds=4, replicas=None, quick=False)) == 4
    with pytest.raises(SystemExit):
        entry.main(["batching", "--replicas", "0"])


def test_only_the_benchmarks_that_run_inference_calibrate_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of `tables` alone needs no CPU-graph rule (a calibration takes seconds); infer, batching and servers
    run on the rule measured on the servers' CPUs."""
    calibrated: list[Path] = []

    def calibrate(work_dir: Path, cores: object, threads: int) -> Path:
        calibrated.append(work_dir)
        return Path(__file__).parents[2] / "onnx"

    monkeypatch.setattr(entry, "calibrated_repository", calibrate)
    monkeypatch.setattr(entry, "rule_summary", lambda repository: "# the rule")
    assert _run_with(monkeypatch, []) == 0 and calibrated == []  # tables
    assert entry.main(["infer", "batching", "--no-pin"]) == 0 and len(calibrated) == 1


def test_the_cpus_split_into_a_serving_set_and_a_load_set() -> None:
    usable = set(os.sched_getaffinity(0))
    cores = plan_cores(True)
    if len(usable) >= 2:
        assert cores.pinned and cores.serve and cores.load and not cores.serve & cores.load
        assert cores.serve | cores.load == usable and cores.threads == len(cores.serve)
    unpinned = plan_cores(False)
    assert not unpinned.pinned and unpinned.serve == unpinned.load == usable
    assert any("threads 3" in line for line in cpu_lines(unpinned, 3))
    assert set(cpu_isa()) <= set(ISA_FLAGS.values())  # the names the service's calibration keys its cache by


def test_an_anchor_in_its_own_process_runs_the_same_graph() -> None:
    before = os.sched_getaffinity(0)
    cpus = frozenset(sorted(before)[-1:])
    with AnchorProcess("onnxruntime", cpus, 1) as anchor:
        assert os.sched_getaffinity(anchor.process.pid) == cpus  # started on its CPUs, this process unmoved
        assert os.sched_getaffinity(0) == before
        anchor.load("ort", model="rope_attention", batch=1, seq=16)
        times = anchor.burst(3)
        got = anchor.output()
        process = anchor.process
    assert not process.is_alive()
    assert len(times) == 3 and all(t > 0 for t in times)
    expected = ort_session_at(graph_path("rope_attention", "cpu", 16), 1).run(["output"], inputs(1, 16))[0]
    np.testing.assert_array_equal(got, expected)


def test_the_kserve_column_is_left_out_with_its_reason_where_kserve_is_not_installed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BENCH_KSERVE_PYTHON", str(tmp_path / "missing" / "python"))
    python, why = kserve_python(create=True)  # a named interpreter is never made
    assert python is None and "no kserve at" in why


def test_the_anchors_run_the_graph_of_the_runs_calibrated_rule(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    """bench/harness.py `calibrated_repository` records the rule in a copy of onnx/; the anchors' graph is the one
    that rule names for the case's length (the servers pin it: POSENC_CPU_FORM_FROM=config)."""
    import json
    import shutil

    from bench.harness import REPOSITORY_ENV, ROOT
    from bench.inprocess import model_file

    shutil.copytree(ROOT / "onnx" / "rope_attention", tmp_path / "rope_attention")
    config_path = tmp_path / "rope_attention" / "config.json"
    config = json.loads(config_path.read_text())
    config["cpu_rule"] = [{"from_sequence": 1, "file": "model.blocked4.onnx"},
                          {"from_sequence": 363, "file": "model.blocked8.onnx"}]
    config_path.write_text(json.dumps(config))
    monkeypatch.setenv(REPOSITORY_ENV, str(tmp_path))
    assert [model_file("rope_attention", "cpu", seq) for seq in (0, 1, 362, 363, 4096)] == [
        "model.blocked4.onnx", "model.blocked4.onnx", "model.blocked4.onnx", "model.blocked8.onnx",
        "model.blocked8.onnx"]
    assert model_file("rope_attention", "cuda", 4096) == "model.onnx"
    assert graph_path("rope_attention", "cpu", 512) == str(tmp_path / "rope_attention" / "model.blocked8.onnx")
