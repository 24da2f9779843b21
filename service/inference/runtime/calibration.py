"""Which of a model's CPU graphs runs a request, decided on the machine that serves it.

A model exported with CPU forms (`posenc.models.export.cpu_forms`: GroupQueryAttention, query blocks) has several
CPU sessions, and which is fastest at which length depends on the CPU: on a 2-core AMD EPYC VM GroupQueryAttention
won from S=512 at llama3_1_attention, while on a 2-core Intel Xeon (AVX-512, AMX) it lost everywhere to the
blocked forms. So the service measures on its own machine: while the server already listens, each such model's
graphs run B=1 at growing sequence lengths in a child process (`calibration_child`: the serving process keeps
none of the buffers the timings grow; the model is not ready until it is done), the best of interleaved rounds
per length (other load only ever adds time), and each length's fastest graph runs the lengths nearest to it
(`fastest_by_size`): the model's rule (`GraphForms`) for the life of the process, so one request always runs on
the graph its rule names and gets the same bits. The whole calibration is bounded by POSENC_CALIBRATION_SECONDS;
a model it cannot finish keeps config.json's rule. Results are cached (`calibration_cache`) keyed by the CPU
model, its ISA, the usable cores, onnxruntime's version, the intra-op threads and every graph's sha256, so the
same wheel decides anew on another CPU and only once on each; POSENC_CALIBRATION_RULES names a read-only file of
rules measured elsewhere (`posenc calibrate --print`). POSENC_CPU_FORM_FROM pins the rule instead (`config`,
`never`, a length).
"""

from __future__ import annotations

import logging
import math
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from posenc.models.crossover import fastest_by_size
from posenc.models.dtypes import BY_KSERVE
from posenc.models.graph_rule import GQA_FILE, STANDARD_FILE, Rule, one_form_rule
from posenc.service.inference.runtime.calibration_cache import CalibrationCache
from posenc.service.inference.runtime.sessions import session_options
from posenc.service.settings import usable_cores

log = logging.getLogger("posenc.inference.calibration")

SEQUENCES = (16, 32, 64, 128, 256, 512, 1024)  # B=1 lengths timed
ROUNDS = 3  # interleaved runs per graph and length, after one warm-up run each
DROP_SLOWER = 2.0  # a graph this many times slower than the fastest at a length is not timed at longer ones,
DROP_FROM_SECONDS = 0.005  # once that length's fastest run takes this long (below, fixed costs decide the order)
# (name, KServe datatype, shape with -1 for dynamic dims, the sequence axis) of one model input
InputShape = tuple[str, str, Sequence[int], int | None]
# /proc/cpuinfo flag -> name: the vector extensions onnxruntime's and numpy's kernels choose their code by
ISA_FLAGS: dict[str, str] = {
    "avx2": "AVX2", "fma": "FMA", "avx512f": "AVX-512", "avx512_vnni": "AVX512-VNNI", "avx512_bf16": "AVX512-BF16",
    "amx_tile": "AMX", "amx_bf16": "AMX-BF16", "amx_int8": "AMX-INT8", "asimd": "NEON", "sve": "SVE",
}


@dataclass(frozen=True)
class Machine:
    """What the timings depend on besides the graphs: the CPU, its vector extensions, the cores we may use."""

    cpu: str
    isa: tuple[str, ...]  # /proc/cpuinfo flags of ISA_FLAGS the CPU has
    cores: int

    def isa_names(self) -> list[str]:
        return [ISA_FLAGS[flag] for flag in self.isa]

    @classmethod
    def here(cls, cpuinfo: Path = Path("/proc/cpuinfo")) -> Machine:
        model, flags = platform.processor() or platform.machine(), set[str]()
        try:
            for line in cpuinfo.read_text(errors="replace").splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model") and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
        except OSError:
            pass
        return cls(model, tuple(flag for flag in ISA_FLAGS if flag in flags), usable_cores())


def cache_key(machine: Machine, threads: int, sha256s: Sequence[str]) -> str:
    """One line naming everything a measured rule depends on (`sha256s`: every graph's, model.onnx first)."""
    return (f"{machine.cpu} | {' '.join(machine.isa) or 'no listed ISA'} | {machine.cores} cores | "
            f"onnxruntime {ort.__version__} | {threads} threads | {' '.join(sha[:16] for sha in sha256s)}")


def default_cache_path() -> Path:
    """$XDG_CACHE_HOME/posenc/calibration.json (~/.cache when unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posenc" / "calibration.json"


def calibration_inputs(inputs: Sequence[InputShape], seq: int,
                       rng: np.random.Generator) -> dict[str, np.ndarray]:
    """B=1 inputs of sequence length `seq` from (name, KServe datatype, shape with -1 dynamic, sequence axis):
    floats are standard normal, integers count positions 0 … seq-1 along the sequence axis."""
    arrays = {}
    for name, datatype, shape, axis in inputs:
        dims = [seq if index == axis else (1 if dim == -1 else dim) for index, dim in enumerate(shape)]
        dtype = BY_KSERVE[datatype].numpy
        if np.issubdtype(dtype, np.integer):
            positions = np.arange(seq, dtype=dtype)
            arrays[name] = np.broadcast_to(positions.reshape([seq if i == axis else 1 for i in range(len(dims))]),
                                           dims).copy()
        else:
            arrays[name] = rng.standard_normal(dims).astype(dtype)
    return arrays


@dataclass(frozen=True)
class Timings:
    sequences: tuple[int, ...]
    seconds: dict[str, tuple[float, ...]]  # file -> best seconds per length (model.onnx first)

    def rule(self) -> Rule:
        """Each measured length's fastest graph, from the middle below it (`fastest_by_size`)."""
        files = list(self.seconds)
        return [(start, files[way]) for start, way in fastest_by_size(self.sequences, list(self.seconds.values()))]

    def document(self) -> dict[str, Any]:
        return {"sequences": list(self.sequences),
                "ms": {file: [round(t * 1e3, 4) if math.isfinite(t) else None for t in times]
                       for file, times in self.seconds.items()}}  # null: not timed there (`time_graphs`)


def time_graphs(sessions: Mapping[str, ort.InferenceSession], inputs: Sequence[InputShape], deadline: float,
                sequences: Sequence[int] = SEQUENCES, rounds: int = ROUNDS) -> Timings | None:
    """Every session's best time at each length (rounds interleaved, the order reversed every other round); None
    when `deadline` (time.monotonic) passes before the longest length is measured. Once a length's fastest run
    takes DROP_FROM_SECONDS, a graph more than DROP_SLOWER times slower is not timed at longer ones (its time
    there: infinity): the attention's work then dominates and grows alike with S in every graph, and the slowest
    graphs would take most of the start-up. (Below that, fixed costs order the graphs: the 16-block form is the
    slowest at S=16 and among the fastest at S=1024.)"""
    rng = np.random.default_rng(0)
    files = list(sessions)
    best: dict[str, list[float]] = {file: [] for file in files}
    timed = list(files)
    for seq in sequences:
        arrays = calibration_inputs(inputs, seq, rng)
        times: dict[str, list[float]] = {file: [] for file in timed}
        for file in timed:
            sessions[file].run(None, arrays)  # warm-up: a shape's first run allocates
        for index in range(rounds):
            for file in timed if index % 2 == 0 else reversed(timed):
                started = time.perf_counter()
                sessions[file].run(None, arrays)
                times[file].append(time.perf_counter() - started)
            if time.monotonic() > deadline:
                return None
        fastest = min(min(values) for values in times.values())
        for file in files:
            best[file].append(min(times[file]) if file in times else math.inf)
        if fastest >= DROP_FROM_SECONDS:
            timed = [file for file in timed if best[file][-1] <= DROP_SLOWER * fastest]
    return Timings(tuple(sequences), {file: tuple(values) for file, values in best.items()})


@dataclass(frozen=True)
class Choice:
    rule: Rule
    how: str  # pinned, never, config, cached, measured, or config because calibration ran out of time


def pinned_rule(setting: str, files: Sequence[str]) -> Rule:
    """POSENC_CPU_FORM_FROM=<length>: model.onnx below it, the GroupQueryAttention form (model.cpu.onnx) from it;
    model.onnx only when the model has none."""
    return one_form_rule(GQA_FILE, int(setting)) if GQA_FILE in files else [(1, STANDARD_FILE)]


def choose_rule(setting: str, configured: Rule | None, files: Sequence[str], measure: Callable[[], Timings | None],
                key: str, rules: CalibrationCache, cache: CalibrationCache) -> Choice:
    """The rule for one model over its graph `files` (model.onnx first): POSENC_CPU_FORM_FROM pins it (`config`:
    config.json's `configured`, model.onnx only when null; `never`; a length), else `calibrate`: the entry for
    `key` in the read-only `rules` (POSENC_CALIBRATION_RULES) or in `cache`, or `measure()` (a `Timings`, put in
    `cache`; None when out of time: config.json's rule then, not cached)."""
    from_config = configured if configured is not None else [(1, STANDARD_FILE)]
    if setting == "config":
        return Choice(from_config, "config.json")
    if setting == "never":
        return Choice([(1, STANDARD_FILE)], "POSENC_CPU_FORM_FROM=never")
    if setting != "calibrate":
        return Choice(pinned_rule(setting, files), f"POSENC_CPU_FORM_FROM={setting}")
    if (known := rules.get(key, files)) is not None:
        return Choice(known, "calibrated for this machine (POSENC_CALIBRATION_RULES)")
    if (cached := cache.get(key, files)) is not None:
        return Choice(cached, "calibrated earlier on this machine (cache)")
    timings = measure()
    if timings is None:
        return Choice(from_config, "config.json (calibration ran out of time: POSENC_CALIBRATION_SECONDS)")
    cache.put(key, cache_entry(timings))
    return Choice(timings.rule(), "calibrated on this machine")


def cache_entry(timings: Timings) -> dict[str, Any]:
    """What the cache keeps of a measurement: the rule, the lengths and times, when."""
    return {"rule": [list(step) for step in timings.rule()], **timings.document(), "measured_at": time.time()}


def config_inputs(config: Mapping[str, Any]) -> list[InputShape]:
    """(name, datatype, shape, sequence axis) of config.json's inputs (the sequence: the first dynamic axis after
    the batch axis)."""
    shapes: list[InputShape] = []
    for entry in config["inputs"]:
        shape = list(entry["shape"])
        axis = next((index for index, dim in enumerate(shape) if dim == -1 and index > 0), None)
        shapes.append((entry["name"], entry["datatype"], shape, axis))
    return shapes


def measuring_sessions(graphs: Mapping[str, bytes | str], threads: int = 0) -> dict[str, ort.InferenceSession]:
    """CPU sessions of graphs (bytes or paths, by file) with the service's options (`sessions.session_options`)
    and `threads` intra-op threads (0: one per usable core)."""
    options = session_options(threads or usable_cores())
    return {file: ort.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])
            for file, graph in graphs.items()}


def measure_rule(graphs: Mapping[str, bytes], config: Mapping[str, Any], threads: int = 0) -> Rule:
    """Which graph (bytes by file, model.onnx first) runs B=1 fastest here at each length (no time bound;
    `measuring_sessions`): `posenc export` records it."""
    timings = time_graphs(measuring_sessions(graphs, threads), config_inputs(config), deadline=float("inf"))
    if timings is None:  # cannot happen without a deadline
        raise RuntimeError("calibration stopped without a deadline")
    return timings.rule()
