"""Which of a model's two CPU graphs runs a request, decided on the machine that serves it.

A model exported with a CPU form (`model.cpu.onnx`: its causal attention as onnxruntime's GroupQueryAttention)
has two CPU sessions, and where the CPU form starts to win depends on the CPU: on a 2-core AMD EPYC VM it
won from S=512 at llama3_1_attention, while on a 2-core Intel Xeon (AVX-512, AMX) it lost at rope_attention
B=8 S=512. So the service measures on its own machine: at start-up, before it reports ready, each such
model's two sessions run B=1 at growing sequence lengths (the best of interleaved rounds per length: other
load only ever adds time), and the first length from which the CPU form stays faster becomes the model's rule
(`GraphForms.pick`) for the life of the process: one request always runs on the graph its rule names, and
gets the same bits. The whole calibration is bounded by POSENC_CALIBRATION_SECONDS; a model it cannot finish
keeps config.json's value. Results are cached in a JSON file keyed by the CPU model, its ISA, the usable
cores, onnxruntime's version, the intra-op threads and both graphs' sha256, so the same wheel decides anew on
another CPU and only once on each. POSENC_CPU_FORM_FROM pins the rule instead (`config`, `never`, a length).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from posenc.models.crossover import crossover
from posenc.models.dtypes import BY_KSERVE
from posenc.service.settings import usable_cores

log = logging.getLogger("posenc.inference.calibration")

SEQUENCES = (16, 32, 64, 128, 256, 512, 1024)  # B=1 lengths timed; the CPU form must win at the longest
ROUNDS = 3  # interleaved runs per graph and length, after one warm-up run each
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


def cache_key(machine: Machine, threads: int, standard_sha256: str, form_sha256: str) -> str:
    """One line naming everything a measured crossover depends on."""
    return (f"{machine.cpu} | {' '.join(machine.isa) or 'no listed ISA'} | {machine.cores} cores | "
            f"onnxruntime {ort.__version__} | {threads} threads | {standard_sha256[:16]} {form_sha256[:16]}")


def default_cache_path() -> Path:
    """$XDG_CACHE_HOME/posenc/calibration.json (~/.cache when unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posenc" / "calibration.json"


class CalibrationCache:
    """Crossovers by `cache_key` in one JSON file; a file that cannot be read or written is no cache (logged)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def _entries(self) -> dict[str, Any]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("calibration cache %s unreadable (%s): measuring again", self.path, exc)
            return {}
        return entries if isinstance(entries, dict) else {}

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._entries().get(key)
        valid = isinstance(entry, dict) and (entry.get("from_sequence") is None or (
            isinstance(entry.get("from_sequence"), int) and entry["from_sequence"] >= 1))
        return entry if valid else None

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        entries = {**self._entries(), key: dict(entry)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            partial.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
            partial.replace(self.path)  # atomic: a concurrent start reads the old file or the new one
        except OSError as exc:
            log.warning("calibration cache %s not written (%s)", self.path, exc)


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
    standard: tuple[float, ...]  # best seconds per length
    form: tuple[float, ...]

    def document(self) -> dict[str, Any]:
        return {"sequences": list(self.sequences), "standard_ms": [round(t * 1e3, 4) for t in self.standard],
                "form_ms": [round(t * 1e3, 4) for t in self.form]}


def time_forms(standard: ort.InferenceSession, form: ort.InferenceSession,
               inputs: Sequence[InputShape], deadline: float,
               sequences: Sequence[int] = SEQUENCES, rounds: int = ROUNDS) -> Timings | None:
    """Both sessions' best time at each length (interleaved rounds); None when `deadline` (time.monotonic)
    passes before the longest length is measured."""
    rng = np.random.default_rng(0)
    best: list[list[float]] = [[], []]
    sessions = (standard, form)
    for seq in sequences:
        arrays = calibration_inputs(inputs, seq, rng)
        times: list[list[float]] = [[], []]
        for session in sessions:
            session.run(None, arrays)  # warm-up: a shape's first run allocates
        for index in range(rounds):
            for side in (0, 1) if index % 2 == 0 else (1, 0):
                started = time.perf_counter()
                sessions[side].run(None, arrays)
                times[side].append(time.perf_counter() - started)
            if time.monotonic() > deadline:
                return None
        for side in (0, 1):
            best[side].append(min(times[side]))
    return Timings(tuple(sequences), tuple(best[0]), tuple(best[1]))


@dataclass(frozen=True)
class Choice:
    from_sequence: int | None  # None: the CPU form never runs
    how: str  # pinned, never, config, cached, measured, or config because calibration ran out of time


def choose_from_sequence(setting: str, configured: int | None, measure: Callable[[], Timings | None], key: str,
                         cache: CalibrationCache) -> Choice:
    """The rule for one model: POSENC_CPU_FORM_FROM pins it (`config`: config.json's `configured`; `never`; a
    length), else `calibrate`: the cache's entry for `key`, or `measure()` (a `Timings`, or None when out of
    time: config.json's value then, not cached)."""
    if setting == "config":
        return Choice(configured, "config.json")
    if setting == "never":
        return Choice(None, "POSENC_CPU_FORM_FROM=never")
    if setting != "calibrate":
        return Choice(int(setting), f"POSENC_CPU_FORM_FROM={setting}")
    if (entry := cache.get(key)) is not None:
        return Choice(entry["from_sequence"], "calibrated earlier on this machine (cache)")
    timings = measure()
    if timings is None:
        return Choice(configured, "config.json (calibration ran out of time: POSENC_CALIBRATION_SECONDS)")
    from_sequence = crossover(timings.sequences, timings.standard, timings.form)
    cache.put(key, {"from_sequence": from_sequence, **timings.document(), "measured_at": time.time()})
    return Choice(from_sequence, "calibrated on this machine")


def config_inputs(config: Mapping[str, Any]) -> list[InputShape]:
    """(name, datatype, shape, sequence axis) of config.json's inputs (the sequence: the first dynamic axis after
    the batch axis)."""
    shapes: list[InputShape] = []
    for entry in config["inputs"]:
        shape = list(entry["shape"])
        axis = next((index for index, dim in enumerate(shape) if dim == -1 and index > 0), None)
        shapes.append((entry["name"], entry["datatype"], shape, axis))
    return shapes


def measure_crossover(standard: bytes, form: bytes, config: Mapping[str, Any], threads: int = 0) -> int | None:
    """From which sequence length `form` runs B=1 faster than `standard` here (no time bound; onnxruntime's
    defaults but spinning off, as the service runs them); None when it is not faster at the longest."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or usable_cores()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sessions = [ort.InferenceSession(graph, sess_options=options, providers=["CPUExecutionProvider"])
                for graph in (standard, form)]
    timings = time_forms(sessions[0], sessions[1], config_inputs(config), deadline=float("inf"))
    if timings is None:  # cannot happen without a deadline
        raise RuntimeError("calibration stopped without a deadline")
    return crossover(timings.sequences, timings.standard, timings.form)
