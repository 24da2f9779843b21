"""The CPU form's length rule, decided on the serving machine (`posenc.service.inference.runtime.calibration`): measured
at start-up within its time bound, cached by machine, onnxruntime version, threads and graph hashes, pinned by
POSENC_CPU_FORM_FROM, and fixed for the life of a process."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from posenc.service.inference.runtime import calibration
from posenc.service.inference.runtime.calibration import CalibrationCache, Machine, Timings, cache_key, choose_rule
from posenc.service.inference.runtime.engine import Engine
from posenc.service.inference.runtime.graph_forms import STANDARD
from posenc.service.inference.runtime.repository import LoadedModel
from posenc.service.settings import Settings
from tests.onnx_models import REPOSITORY

INTEL = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile amx_bf16
"""
AMD = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx2 fma
"""


def test_the_machine_is_read_from_cpuinfo(tmp_path: Path) -> None:
    (tmp_path / "intel").write_text(INTEL)
    (tmp_path / "amd").write_text(AMD)
    intel, amd = Machine.here(tmp_path / "intel"), Machine.here(tmp_path / "amd")
    assert intel.cpu == "Intel(R) Xeon(R) Platinum 8480+" and intel.isa == (
        "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    assert amd.cpu == "AMD EPYC 7B13" and amd.isa == ("avx2", "fma")
    # the same graphs and threads on another CPU are measured anew
    shas = ["a" * 64, "b" * 64]
    assert cache_key(intel, 2, shas) != cache_key(amd, 2, shas)
    assert cache_key(intel, 2, shas) != cache_key(intel, 4, shas)
    assert cache_key(intel, 2, shas) != cache_key(intel, 2, ["a" * 64, "c" * 64])
    assert cache_key(intel, 2, shas) != cache_key(intel, 2, [*shas, "d" * 64])  # one more graph
    assert Machine.here(tmp_path / "missing").cores >= 1  # no /proc: still a machine


FILES = [STANDARD, "model.cpu.onnx", "model.blocked4.onnx"]
# model.onnx fastest at 16, the CPU form at 256, the blocked form at 1024
TIMINGS = Timings((16, 256, 1024), {STANDARD: (1.0, 2.0, 4.0), "model.cpu.onnx": (2.0, 1.5, 3.0),
                                    "model.blocked4.onnx": (3.0, 1.8, 2.5)})
MEASURED = [(1, STANDARD), (65, "model.cpu.onnx"), (513, "model.blocked4.onnx")]
CONFIGURED = [(1, STANDARD), (512, "model.cpu.onnx")]


NO_RULES = CalibrationCache(None, writable=False)


def _never() -> Timings:
    raise AssertionError("measured although the rule was pinned or cached")


@pytest.mark.parametrize(("setting", "expected"), [
    ("config", CONFIGURED), ("never", [(1, STANDARD)]), ("64", [(1, STANDARD), (64, "model.cpu.onnx")]),
    ("1", [(1, "model.cpu.onnx")])])
def test_a_pinned_rule_measures_nothing(tmp_path: Path, setting: str, expected: list) -> None:
    cache = CalibrationCache(tmp_path / "c.json")
    assert choose_rule(setting, CONFIGURED, FILES, _never, "key", NO_RULES, cache).rule == expected
    assert not (tmp_path / "c.json").exists()


def test_a_pinned_length_without_a_group_query_form_is_model_onnx() -> None:
    assert calibration.pinned_rule("64", [STANDARD, "model.blocked4.onnx"]) == [(1, STANDARD)]
    assert choose_rule("config", None, FILES, _never, "key", NO_RULES, CalibrationCache(None)).rule == [(1, STANDARD)]


def test_calibrate_measures_once_then_reads_the_cache(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path / "posenc" / "c.json")
    first = choose_rule("calibrate", CONFIGURED, FILES, lambda: TIMINGS, "key", NO_RULES, cache)
    assert (first.rule, first.how) == (MEASURED, "calibrated on this machine")
    saved = json.loads((tmp_path / "posenc" / "c.json").read_text())["key"]
    assert saved["rule"] == [list(step) for step in MEASURED] and saved["sequences"] == [16, 256, 1024]
    assert saved["ms"]["model.blocked4.onnx"] == [3000.0, 1800.0, 2500.0]
    again = choose_rule("calibrate", CONFIGURED, FILES, _never, "key", NO_RULES, cache)
    assert (again.rule, again.how) == (MEASURED, "calibrated earlier on this machine (cache)")
    slow = Timings((16,), {STANDARD: (1.0,), "model.cpu.onnx": (2.0,), "model.blocked4.onnx": (2.0,)})
    other = choose_rule("calibrate", CONFIGURED, FILES, lambda: slow, "other key", NO_RULES, cache)
    assert other.rule == [(1, STANDARD)]  # no form faster here: model.onnx only, and that is cached too
    assert set(json.loads((tmp_path / "posenc" / "c.json").read_text())) == {"key", "other key"}


def test_a_cached_rule_over_other_files_is_measured_again(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path / "c.json")
    choose_rule("calibrate", CONFIGURED, FILES, lambda: TIMINGS, "key", NO_RULES, cache)
    assert cache.get("key", [STANDARD, "model.cpu.onnx"]) is None  # names model.blocked4.onnx, gone


def test_out_of_time_keeps_config_json_and_caches_nothing(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path / "c.json")
    choice = choose_rule("calibrate", CONFIGURED, FILES, lambda: None, "key", NO_RULES, cache)
    assert choice.rule == CONFIGURED and "ran out of time" in choice.how
    assert cache.get("key", FILES) is None


@pytest.mark.parametrize("content", [
    "{not json", "[1, 2]", '{"key": {"rule": [[0, "model.onnx"]]}}', '{"key": {"rule": [["1", "model.onnx"]]}}',
    '{"key": {"rule": []}}', '{"key": {"rule": [[1, "model.onnx"], [1, "model.cpu.onnx"]]}}',
    '{"key": {"rule": [[1, "../x.onnx"]]}}', '{"key": {"from_sequence": 512}}', '{"key": 5}'])
def test_a_broken_cache_is_measured_again(tmp_path: Path, content: str) -> None:
    (tmp_path / "c.json").write_text(content)
    cache = CalibrationCache(tmp_path / "c.json")
    assert choose_rule("calibrate", CONFIGURED, FILES, lambda: TIMINGS, "key", NO_RULES, cache).rule == MEASURED


def test_an_unwritable_cache_is_no_cache(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    cache = CalibrationCache(tmp_path / "file" / "c.json")  # its folder is a file
    assert choose_rule("calibrate", CONFIGURED, FILES, lambda: TIMINGS, "key", NO_RULES, cache).rule == MEASURED


@pytest.mark.parametrize("value", ["sometimes", "0", "-5", "1.5", ""])
def test_the_setting_names_what_it_takes(value: str) -> None:
    with pytest.raises(ValidationError, match="cpu_form_from"):
        Settings(cpu_form_from=value)


def test_calibration_inputs_count_positions_along_the_sequence() -> None:
    shapes = [("query", "FP32", [-1, 4, -1, 8], 2), ("position_ids", "INT64", [-1, -1], 1)]
    arrays = calibration.calibration_inputs(shapes, 5, np.random.default_rng(0))
    assert arrays["query"].shape == (1, 4, 5, 8) and arrays["query"].dtype == np.float32
    assert arrays["position_ids"].tolist() == [[0, 1, 2, 3, 4]]


def _rope_repository(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPOSITORY / "rope_attention", repo / "rope_attention")
    return repo


def test_start_up_calibrates_on_this_machine_then_starts_from_the_cache(tmp_path: Path) -> None:
    repo, cache = _rope_repository(tmp_path), tmp_path / "calibration.json"
    settings = Settings(model_repository=repo, cpu_form_from="calibrate", calibration_cache=str(cache),
                        intra_op_num_threads=1)
    engine = Engine(settings)
    assert engine.load() == []
    model = engine.models["rope_attention"]
    assert isinstance(model, LoadedModel) and model.forms is not None
    assert model.forms.how == "calibrated on this machine"
    (key, entry), = json.loads(cache.read_text()).items()
    assert Machine.here().cpu in key and "1 threads" in key
    assert [tuple(step) for step in entry["rule"]] == list(model.forms.rule)
    assert set(entry["ms"]) == {STANDARD, "model.cpu.onnx", "model.blocked4.onnx", "model.blocked8.onnx",
                                "model.blocked16.onnx"}
    assert all(len(times) == len(calibration.SEQUENCES) for times in entry["ms"].values())
    again = Engine(settings)
    assert again.load() == []
    second = again.models["rope_attention"]
    assert isinstance(second, LoadedModel) and second.forms is not None
    assert (second.forms.rule, second.forms.how) == (model.forms.rule, "calibrated earlier on this machine (cache)")


def test_no_time_for_calibration_keeps_config_json(tmp_path: Path) -> None:
    repo = _rope_repository(tmp_path)
    engine = Engine(Settings(model_repository=repo, cpu_form_from="calibrate", calibration_cache="off",
                             calibration_seconds=0, intra_op_num_threads=1))
    assert engine.load() == []
    model = engine.models["rope_attention"]
    configured = json.loads((repo / "rope_attention" / "config.json").read_text())["cpu_rule"]
    assert isinstance(model, LoadedModel) and model.forms is not None
    assert model.forms.rule == [(step["from_sequence"], step["file"]) for step in configured]
    assert "ran out of time" in model.forms.how


def test_never_runs_model_onnx_at_every_length(tmp_path: Path) -> None:
    engine = Engine(Settings(model_repository=_rope_repository(tmp_path), cpu_form_from="never"))
    assert engine.load() == []
    model = engine.models["rope_attention"]
    assert isinstance(model, LoadedModel) and model.forms is not None
    long = {"query": np.zeros((1, 8, 4096, 64), np.float32)}
    assert model.forms.pick(long)[0] == STANDARD


class _Busy:
    """A session whose run takes `seconds` (a busy wait), counting its runs."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.runs = seconds, 0

    def run(self, outputs: object, feeds: object) -> None:
        self.runs += 1
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass


def test_a_graph_far_slower_than_the_fastest_is_not_timed_at_longer_lengths(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibration, "DROP_FROM_SECONDS", 0.0005)
    fast, slow, close = _Busy(0.001), _Busy(0.004), _Busy(0.0012)
    sessions = {STANDARD: fast, "model.cpu.onnx": slow, "model.blocked4.onnx": close}
    timings = calibration.time_graphs(sessions, [("query", "FP32", [-1, -1], 1)], deadline=time.monotonic() + 60,
                                      sequences=(16, 32, 64), rounds=3)
    assert timings is not None
    assert slow.runs == 4 and fast.runs == close.runs == 12  # a warm-up and 3 rounds at each length it is timed
    assert timings.seconds["model.cpu.onnx"][1:] == (math.inf, math.inf)
    assert all(math.isfinite(t) for t in timings.seconds["model.blocked4.onnx"])
    assert timings.rule() == [(1, STANDARD)]
    assert timings.document()["ms"]["model.cpu.onnx"][1:] == [None, None]  # JSON without Infinity


def test_below_the_drop_time_every_graph_is_timed_at_every_length() -> None:
    fast, slow = _Busy(0.0001), _Busy(0.0004)  # fixed costs: the order may change with S
    timings = calibration.time_graphs({STANDARD: fast, "model.blocked16.onnx": slow}, [("query", "FP32", [-1, -1], 1)],
                                      deadline=time.monotonic() + 60, sequences=(16, 32), rounds=3)
    assert timings is not None and fast.runs == slow.runs == 8


def test_a_deadline_already_past_stops_after_the_first_round() -> None:
    """`time_graphs` gives up (None: config.json's rule) as soon as a round ends past its deadline: one warm-up and
    one timed run of each graph at the first length, nothing longer."""
    first, second = _Busy(0.0001), _Busy(0.0001)
    timings = calibration.time_graphs({STANDARD: first, "model.blocked4.onnx": second},
                                      [("query", "FP32", [-1, -1], 1)], deadline=time.monotonic() - 1,
                                      sequences=(16, 32), rounds=3)
    assert timings is None and first.runs == second.runs == 2
