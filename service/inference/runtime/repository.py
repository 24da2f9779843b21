"""The model repository: find models, read config.json, build and check onnxruntime sessions.

Layout: `<repository>/<model>/model.onnx` + `<model>/config.json` (written by `posenc export`), and
the CPU form `model.cpu.onnx` where config.json names one (`cpu_model`: loaded beside model.onnx when the
model runs on the CPU only).
Loading a folder gives a `LoadedModel` (config and session agree) or a `FailedModel` naming the
problem (unreadable config.json, sha256 mismatch, a session whose inputs/outputs differ from
config.json, no CUDA device when `POSENC_PROVIDERS=cuda`): one broken model never stops the others.
This module loads and describes the models; running them is `posenc.service.inference.runtime.engine`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from posenc.models.dtypes import BY_KSERVE, BY_ONNX
from posenc.models.graph_rule import STANDARD_FILE, CpuForm, cpu_forms_of
from posenc.service.errors import Unavailable
from posenc.service.inference.runtime import calibration
from posenc.service.inference.runtime.calibration_child import measure_apart
from posenc.service.inference.runtime.devices import CPU, CUDA
from posenc.service.inference.runtime.graph_forms import GraphForms
from posenc.service.inference.runtime.run_bound import cuda_arena_limit
from posenc.service.inference.runtime.sessions import new_session, session_options
from posenc.service.settings import Settings, usable_cores

log = logging.getLogger("posenc.inference.repository")

# onnxruntime's own load errors (InvalidProtobuf, InvalidGraph, Fail, ...) derive from Exception only.
_ORT_STATE = ort.capi.onnxruntime_pybind11_state
ORT_ERRORS: tuple[type[Exception], ...] = tuple(
    getattr(_ORT_STATE, name) for name in ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError",
                                           "RuntimeException", "InvalidProtobuf", "ModelLoaded", "NotImplemented",
                                           "InvalidGraph", "EPFail") if hasattr(_ORT_STATE, name)
)


class ConfigError(ValueError):
    """config.json is missing, malformed, or disagrees with the model file or session."""


# Failures whose message is reported as the model's readiness problem.
LOAD_ERRORS: tuple[type[Exception], ...] = (OSError, json.JSONDecodeError, ConfigError, *ORT_ERRORS)


@dataclass(frozen=True)
class ModelTensor:
    """One input or output of config.json: KServe datatype and shape, -1 for a dynamic dimension
    (dim 0 is the batch)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def sequence_axis(self) -> int | None:
        """The dynamic axis after the batch axis (the sequence), if any."""
        dynamic = [axis for axis, dim in enumerate(self.shape) if dim == -1 and axis > 0]
        return dynamic[0] if dynamic else None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def _model_tensors(entries: Any, what: str) -> tuple[ModelTensor, ...]:
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"'{what}' must be a non-empty list")
    tensors = []
    for entry in entries:
        try:
            tensor = ModelTensor(str(entry["name"]), str(entry["datatype"]), tuple(int(d) for d in entry["shape"]))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"'{what}' entries need name, datatype and shape (got {entry!r})") from None
        if tensor.datatype not in BY_KSERVE or not tensor.shape or tensor.shape[0] != -1:
            raise ConfigError(f"{what} '{tensor.name}': known datatype and a dynamic batch dim 0 required")
        tensors.append(tensor)
    return tuple(tensors)


@dataclass(frozen=True)
class ModelConfig:
    """The parts of config.json the service relies on (the whole file is kept in `raw`)."""

    name: str
    inputs: tuple[ModelTensor, ...]
    outputs: tuple[ModelTensor, ...]
    max_batch_size: int
    causal: bool
    max_position: int | None
    sha256: str | None
    raw: Mapping[str, Any]

    @classmethod
    def parse(cls, name: str, data: Any) -> ModelConfig:
        if not isinstance(data, dict):
            raise ConfigError("config.json must hold a JSON object")
        max_batch = data.get("max_batch_size", 1)
        max_position = data.get("max_position")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ConfigError(f"max_batch_size must be an integer >= 1 (got {max_batch!r})")
        if max_position is not None and (not isinstance(max_position, int) or max_position < 1):
            raise ConfigError(f"max_position must be an integer >= 1 (got {max_position!r})")
        return cls(name, _model_tensors(data.get("inputs"), "inputs"), _model_tensors(data.get("outputs"), "outputs"),
                   max_batch, bool(data.get("causal", False)), max_position, data.get("sha256"), data)

    @property
    def output_names(self) -> list[str]:
        return [tensor.name for tensor in self.outputs]


@dataclass(frozen=True)
class LoadedModel:
    """A model whose session was built and agrees with its config.json (run by
    `posenc.service.inference.runtime.engine`)."""

    name: str
    config: ModelConfig
    session: ort.InferenceSession
    providers: list[str]
    # Bind inputs and outputs to the device (default: on CUDA): one host→device copy per input, one device→host
    # copy per output, instead of onnxruntime staging numpy arrays through extra copies on every run
    # (`posenc.service.inference.runtime.engine.run_model` reads it).
    io_binding: bool | None = None
    # Each output's dims: a fixed size, or (input name, axis) whose size it takes (the same symbolic dim in
    # model.onnx); outputs with a dim no input names are left out.
    output_dims: Mapping[str, tuple[int | tuple[str, int], ...]] = field(default_factory=dict)
    # every CPU graph (model.onnx and its CPU forms), when the model has forms and runs on the CPU: each request
    # runs on its sequence length's graph (`posenc.service.inference.runtime.graph_forms`); None: every run on `session`
    forms: GraphForms | None = None

    ready = True
    problem = None

    def output_shape(self, name: str, inputs: Mapping[str, np.ndarray]) -> tuple[int, ...] | None:
        """The shape output `name` will have for `inputs`, where the model's symbolic dims say so (else None)."""
        dims = self.output_dims.get(name)
        if dims is None or any(isinstance(d, tuple) and d[0] not in inputs for d in dims):
            return None
        return tuple(d if isinstance(d, int) else int(inputs[d[0]].shape[d[1]]) for d in dims)


@dataclass(frozen=True)
class FailedModel:
    """A repository entry that could not be served, and why (reported by the readiness endpoints)."""

    name: str
    problem: str

    ready = False
    providers: tuple[str, ...] = ()


@dataclass(frozen=True)
class LoadingModel(FailedModel):
    """A repository entry whose sessions are being built and whose CPU graphs are being chosen (the server listens
    before its models are loaded): not ready yet, answered 503 with Retry-After."""

    problem: str = "loading"


VERSION = "1"  # every model has one version
RepositoryEntry = LoadedModel | FailedModel
LOADING_RETRY_SECONDS = 2  # Retry-After of a request for a model still loading (calibration takes seconds)


def loading(name: str) -> LoadingModel:
    return LoadingModel(name, f"model '{name}' is loading (its sessions are built and its CPU graphs chosen)")


def ensure_ready(model: RepositoryEntry) -> LoadedModel:
    """The loaded model, or 503 naming why it cannot be served."""
    if isinstance(model, LoadingModel):
        raise Unavailable(f"model '{model.name}' is not ready yet: {model.problem}",
                          retry_after=LOADING_RETRY_SECONDS)
    if isinstance(model, FailedModel):
        raise Unavailable(f"model '{model.name}' is not ready: {model.problem}", retry_after=5)
    return model


def resolve_providers(setting: str) -> list[str]:
    """Providers to ask onnxruntime for: `cpu`, `cuda` (CUDA then CPU), `auto` (CUDA if built in)."""
    available = ort.get_available_providers()
    if setting == "cpu":
        return [CPU]
    if setting == "cuda" and CUDA not in available:
        raise ConfigError("POSENC_PROVIDERS=cuda but this onnxruntime has no CUDAExecutionProvider "
                          "(install onnxruntime-gpu)")
    return [CUDA, CPU] if CUDA in available else [CPU]


def _with_options(providers: list[str], settings: Settings) -> list[str | tuple[str, dict[str, str]]]:
    """CUDA's arena grows only by what is requested (not to the next power of two) and up to a cap, so a few large
    requests cannot leave the process holding most of the device."""
    result: list[str | tuple[str, dict[str, str]]] = []
    for provider in providers:
        if provider != CUDA:
            result.append(provider)
            continue
        options = {"arena_extend_strategy": "kSameAsRequested"}
        limit = settings.cuda_arena_bytes or cuda_arena_limit()
        if limit:
            options["gpu_mem_limit"] = str(limit)
        result.append((CUDA, options))
    return result


def intra_op_threads(setting: int) -> int:
    """0 = one per CPU this process may run on."""
    return setting if setting > 0 else usable_cores()


def _check_session(config: ModelConfig, session: ort.InferenceSession) -> None:
    """config.json inputs/outputs == the session's (names, order-free; datatypes; static dims; -1 ↔ dynamic)."""
    for what, declared_tensors, actual in (("input", config.inputs, session.get_inputs()),
                                           ("output", config.outputs, session.get_outputs())):
        declared = {tensor.name: tensor for tensor in declared_tensors}
        found = {arg.name: arg for arg in actual}
        if set(declared) != set(found):
            raise ConfigError(f"{what}s differ: config.json {sorted(declared)}, model.onnx {sorted(found)}")
        for name, tensor in declared.items():
            arg = found[name]
            dims = [d if isinstance(d, int) else -1 for d in arg.shape]  # symbolic or None → dynamic
            onnx_type = BY_ONNX.get(arg.type)
            if onnx_type is None or onnx_type.kserve != tensor.datatype or dims != list(tensor.shape):
                raise ConfigError(f"{what} '{name}': config.json says {tensor.datatype} {list(tensor.shape)}, "
                                  f"model.onnx has {arg.type} {dims}")


def output_dims(session: ort.InferenceSession) -> dict[str, tuple[int | tuple[str, int], ...]]:
    """`LoadedModel.output_dims` from the session's metadata: an output dim is a fixed size, or the first input
    axis with the same symbolic name (`batch`, `sequence`, ...)."""
    axes: dict[str, tuple[str, int]] = {}
    for arg in session.get_inputs():
        for axis, dim in enumerate(arg.shape):
            if isinstance(dim, str) and dim:
                axes.setdefault(dim, (arg.name, axis))
    result = {}
    for arg in session.get_outputs():
        dims = [dim if isinstance(dim, int) else axes.get(dim) if isinstance(dim, str) else None for dim in arg.shape]
        if all(dim is not None for dim in dims):
            result[arg.name] = tuple(dim for dim in dims if dim is not None)
    return result


def _read_config(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config.json is not valid JSON ({exc})") from None


def _model_bytes(folder: Path, file: str, sha256: str | None) -> bytes:
    model_bytes = (folder / file).read_bytes()
    if sha256 and hashlib.sha256(model_bytes).hexdigest() != sha256:
        raise ConfigError(f"{file} does not match the sha256 in config.json")
    return model_bytes


def _session_options(settings: Settings) -> ort.SessionOptions:
    return session_options(intra_op_threads(settings.intra_op_num_threads))


def _session(config: ModelConfig, folder: Path, settings: Settings) -> ort.InferenceSession:
    model_bytes = _model_bytes(folder, "model.onnx", config.sha256)
    providers = _with_options(resolve_providers(settings.providers), settings)
    session = new_session(model_bytes, _session_options(settings), providers)
    if settings.providers == "cuda" and CUDA not in session.get_providers():
        raise ConfigError("POSENC_PROVIDERS=cuda but onnxruntime could not use a CUDA device")
    _check_session(config, session)
    return session


def _graph_forms(config: ModelConfig, folder: Path, settings: Settings, session: ort.InferenceSession,
                 deadline: float) -> GraphForms | None:
    """The CPU graphs a model with CPU forms runs on the CPU only, and the rule that picks one by sequence length
    (calibrated on this machine by `deadline` (time.monotonic), in a child process, or pinned:
    POSENC_CPU_FORM_FROM). Only the graphs the rule names get a session here: the others are never run."""
    try:
        forms, configured = cpu_forms_of(config.raw)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not forms or session.get_providers() != [CPU]:
        return None
    graphs = cpu_graphs(config, folder, forms)
    threads = session.get_session_options().intra_op_num_threads
    key = calibration_key(graphs, threads)
    shapes = [(t.name, t.datatype, t.shape, t.sequence_axis()) for t in config.inputs]

    def measure() -> calibration.Timings | None:
        return measure_apart({file: folder / file for file in graphs}, shapes, threads, deadline)

    choice = calibration.choose_rule(settings.cpu_form_from, configured, list(graphs), measure, key,
                                     *calibration_caches(settings))
    sessions = {STANDARD_FILE: session}
    for file in {file for _, file in choice.rule} - {STANDARD_FILE}:
        sessions[file] = new_session(graphs[file], _session_options(settings), [CPU])
        _check_session(config, sessions[file])
    axes = {t.name: axis for t in config.inputs if (axis := t.sequence_axis()) is not None}
    forms_of = GraphForms(sessions, choice.rule, axes, choice.how)
    log.info("model %s: %s (%s)", config.name, forms_of.describe(), choice.how)
    return forms_of


def cpu_graphs(config: ModelConfig, folder: Path, forms: Sequence[CpuForm]) -> dict[str, bytes]:
    """model.onnx and each CPU form's file, by file, each checked against its sha256 in config.json."""
    graphs = {STANDARD_FILE: _model_bytes(folder, STANDARD_FILE, config.sha256)}
    graphs.update({form.file: _model_bytes(folder, form.file, form.sha256) for form in forms})
    return graphs


def calibration_key(graphs: Mapping[str, bytes], threads: int) -> str:
    """The cache key of a model's CPU graphs (model.onnx first) timed with `threads` intra-op threads here."""
    return calibration.cache_key(calibration.Machine.here(), threads,
                                 [hashlib.sha256(graph).hexdigest() for graph in graphs.values()])


def calibration_caches(settings: Settings) -> tuple[calibration.CalibrationCache, calibration.CalibrationCache]:
    """(the read-only rules POSENC_CALIBRATION_RULES names, the writable cache POSENC_CALIBRATION_CACHE); a file
    not set or `off` is an empty cache."""
    cache = settings.calibration_cache
    cache_path = None if cache == "off" else Path(cache).expanduser() if cache else calibration.default_cache_path()
    rules_path = Path(settings.calibration_rules).expanduser() if settings.calibration_rules else None
    return (calibration.CalibrationCache(rules_path, writable=False), calibration.CalibrationCache(cache_path))


def load_model(name: str, folder: Path, settings: Settings, deadline: float | None = None) -> LoadedModel | FailedModel:
    """Read config.json, check the file hash, build the session and check it against config.json."""
    try:
        config = ModelConfig.parse(name, _read_config(folder / "config.json"))
        session = _session(config, folder, settings)
        deadline = time.monotonic() + settings.calibration_seconds if deadline is None else deadline
        forms = _graph_forms(config, folder, settings, session, deadline)
    except LOAD_ERRORS as exc:
        failed = FailedModel(name, f"model '{name}': {exc}")
        log.error("%s", failed.problem)
        return failed
    except Exception:  # one broken model must not take the service down; details go to the log
        failed = FailedModel(name, f"model '{name}': failed to load (the service log has the details)")
        log.exception("%s", failed.problem)
        return failed
    model = LoadedModel(name, config, session, session.get_providers(), output_dims=output_dims(session),
                        forms=forms)
    log.info("model %s loaded: providers %s, %d intra-op threads", name, model.providers,
             session.get_session_options().intra_op_num_threads)
    return model


def model_folders(root: Path) -> Iterator[Path]:
    """Every `<root>/<name>/` holding a model.onnx or a config.json (hidden and `_` folders skipped), sorted."""
    entries = (p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    yield from sorted(p for p in entries if (p / "model.onnx").exists() or (p / "config.json").exists())
