"""Model repository and onnxruntime sessions: load, validate against config.json, run in worker threads.

Repository layout: `<repository>/<model>/model.onnx` + `<model>/config.json` (written by
`posenc export`). Every model found is loaded at start-up; a model whose config.json is unreadable,
whose sha256 does not match, or whose session inputs/outputs differ from config.json is kept with a
`problem` (its ready endpoint and `/readyz` report it) instead of failing the whole service.
One session per model per process; `run` is called from worker threads (onnxruntime releases the GIL).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.batcher import Batcher, BatchObserver
from service.errors import BadRequest, NotFound, Unavailable
from service.kserve import DATATYPES, InputTensor
from service.settings import Settings

log = logging.getLogger("posenc.engine")

ORT_DATATYPES = {
    "tensor(float)": "FP32", "tensor(float16)": "FP16", "tensor(double)": "FP64", "tensor(bfloat16)": "BF16",
    "tensor(int64)": "INT64", "tensor(int32)": "INT32", "tensor(int16)": "INT16", "tensor(int8)": "INT8",
    "tensor(uint8)": "UINT8", "tensor(bool)": "BOOL",
}
# onnxruntime's own load errors (InvalidProtobuf, InvalidGraph, Fail, ...) derive from Exception only.
_ORT_STATE = ort.capi.onnxruntime_pybind11_state
ORT_ERRORS: tuple[type[Exception], ...] = tuple(
    getattr(_ORT_STATE, name) for name in ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError",
                                           "RuntimeException", "InvalidProtobuf", "ModelLoaded", "NotImplemented",
                                           "InvalidGraph", "EPFail") if hasattr(_ORT_STATE, name)
)
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
VERSION = "1"


class ConfigError(ValueError):
    """config.json is missing, malformed, or disagrees with the model file or session."""


# Failures whose message is reported as the model's readiness problem.
LOAD_ERRORS: tuple[type[Exception], ...] = (OSError, json.JSONDecodeError, ConfigError, *ORT_ERRORS)


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of config.json; -1 marks a dynamic dimension (dim 0 is the batch)."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def sequence_axis(self) -> int | None:
        """The dynamic axis after the batch axis (the sequence), if any."""
        dynamic = [axis for axis, dim in enumerate(self.shape) if dim == -1 and axis > 0]
        return dynamic[0] if dynamic else None

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def _tensor_specs(entries: Any, what: str) -> tuple[TensorSpec, ...]:
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"'{what}' must be a non-empty list")
    specs = []
    for entry in entries:
        try:
            spec = TensorSpec(str(entry["name"]), str(entry["datatype"]), tuple(int(d) for d in entry["shape"]))
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"'{what}' entries need name, datatype and shape (got {entry!r})") from None
        if spec.datatype not in DATATYPES or not spec.shape or spec.shape[0] != -1:
            raise ConfigError(f"{what} '{spec.name}': known datatype and a dynamic batch dim 0 required")
        specs.append(spec)
    return tuple(specs)


@dataclass(frozen=True)
class ModelConfig:
    """The parts of config.json the service relies on (the whole file is kept in `raw`)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
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
        return cls(name, _tensor_specs(data.get("inputs"), "inputs"), _tensor_specs(data.get("outputs"), "outputs"),
                   max_batch, bool(data.get("causal", False)), max_position, data.get("sha256"), data)


def resolve_providers(setting: str) -> list[str]:
    """Providers to ask onnxruntime for: `cpu`, `cuda` (CUDA then CPU), `auto` (CUDA if built in)."""
    available = ort.get_available_providers()
    if setting == "cpu":
        return [CPU]
    if setting == "cuda" and CUDA not in available:
        raise ConfigError("POSENC_PROVIDERS=cuda but this onnxruntime has no CUDAExecutionProvider "
                          "(install onnxruntime-gpu)")
    return [CUDA, CPU] if CUDA in available else [CPU]


def intra_op_threads(setting: int) -> int:
    """0 = one per CPU this process may run on."""
    if setting > 0:
        return setting
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _check_session(config: ModelConfig, session: ort.InferenceSession) -> None:
    """config.json inputs/outputs == the session's (names, order-free; datatypes; static dims; -1 ↔ dynamic)."""
    for what, specs, actual in (("input", config.inputs, session.get_inputs()),
                                ("output", config.outputs, session.get_outputs())):
        declared = {spec.name: spec for spec in specs}
        found = {arg.name: arg for arg in actual}
        if set(declared) != set(found):
            raise ConfigError(f"{what}s differ: config.json {sorted(declared)}, model.onnx {sorted(found)}")
        for name, spec in declared.items():
            arg = found[name]
            dims = [d if isinstance(d, int) else -1 for d in arg.shape]  # symbolic or None → dynamic
            if ORT_DATATYPES.get(arg.type) != spec.datatype or dims != list(spec.shape):
                raise ConfigError(f"{what} '{name}': config.json says {spec.datatype} {list(spec.shape)}, "
                                  f"model.onnx has {arg.type} {dims}")


def _read_config(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"config.json is not valid JSON ({exc})") from None


class Model:
    """One repository entry: its config, its session (when it loaded) and its batcher."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name = name
        self.folder = folder
        self.config: ModelConfig | None = None
        self.session: ort.InferenceSession | None = None
        self.providers: list[str] = []
        self.problem: str | None = "not loaded"
        self.batcher: Batcher | None = None

    @property
    def ready(self) -> bool:
        return self.problem is None

    def load(self, settings: Settings) -> None:
        """Read config.json, check the file hash, build the session, check it; sets `problem` on failure."""
        try:
            config = ModelConfig.parse(self.name, _read_config(self.folder / "config.json"))
            model_bytes = (self.folder / "model.onnx").read_bytes()
            if config.sha256 and hashlib.sha256(model_bytes).hexdigest() != config.sha256:
                raise ConfigError("model.onnx does not match the sha256 in config.json")
            options = ort.SessionOptions()
            options.intra_op_num_threads = intra_op_threads(settings.intra_op_num_threads)
            options.inter_op_num_threads = 1  # the graph is a chain of fused nodes: nothing to overlap
            # Idle intra-op threads would otherwise spin and steal CPU from the event loop and other models.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            requested = resolve_providers(settings.providers)
            session = ort.InferenceSession(model_bytes, sess_options=options, providers=requested)
            if settings.providers == "cuda" and CUDA not in session.get_providers():
                raise ConfigError("POSENC_PROVIDERS=cuda but onnxruntime could not use a CUDA device")
            _check_session(config, session)
        except LOAD_ERRORS as exc:
            self.problem = f"model '{self.name}': {exc}"
            log.error("%s", self.problem)
            return
        except Exception:  # one broken model must not take the service down; details go to the log
            self.problem = f"model '{self.name}': failed to load (the service log has the details)"
            log.exception("%s", self.problem)
            return
        self.config, self.session, self.providers, self.problem = config, session, session.get_providers(), None
        log.info("model %s loaded: providers %s, %d intra-op threads", self.name, self.providers,
                 options.intra_op_num_threads)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Synchronous onnxruntime run (call from a worker thread)."""
        if self.session is None or self.config is None:
            raise Unavailable(f"model '{self.name}' is not ready: {self.problem}", retry_after=5)
        names = [spec.name for spec in self.config.outputs]
        results = self.session.run(names, dict(inputs))
        return dict(zip(names, results, strict=True))

    def metadata(self) -> dict[str, Any]:
        """KServe model metadata (+ readiness, providers, max_batch_size and the rope configuration)."""
        meta: dict[str, Any] = {"name": self.name, "versions": [VERSION], "platform": "onnxruntime_onnx",
                                "ready": self.ready, "providers": self.providers}
        if self.config is None:
            return {**meta, "inputs": [], "outputs": [], "problem": self.problem}
        raw = self.config.raw
        meta.update(inputs=[s.as_json() for s in self.config.inputs],
                    outputs=[s.as_json() for s in self.config.outputs],
                    parameters={"max_batch_size": self.config.max_batch_size, "causal": self.config.causal,
                                "max_position": self.config.max_position, "opset": raw.get("opset"),
                                "attention": raw.get("attention"), "rope": raw.get("rope"),
                                "sha256": self.config.sha256})
        if self.problem:
            meta["problem"] = self.problem
        return meta

    def check_inputs(self, tensors: Sequence[InputTensor]) -> dict[str, np.ndarray]:
        """Validate request tensors against config.json; every mismatch is a 400 naming the tensor."""
        config = self.ensure_ready()
        given = {t.name: t for t in tensors}
        expected = [spec.name for spec in config.inputs]
        missing = [name for name in expected if name not in given]
        unknown = [name for name in given if name not in expected]
        if unknown:
            raise BadRequest(f"unknown input(s) {unknown}; model '{self.name}' takes {expected}")
        if missing:
            raise BadRequest(f"missing input(s) {missing}; model '{self.name}' takes {expected}")
        _check_heads(given)
        for spec in config.inputs:
            _check_tensor(spec, given[spec.name])
        _check_shared_dims(config.inputs, given)
        if config.max_position is not None and "position_ids" in given:
            _check_positions(given["position_ids"].array, config.max_position)
        return {spec.name: given[spec.name].array for spec in config.inputs}

    def check_outputs(self, names: Sequence[str]) -> None:
        known = [spec.name for spec in self.ensure_ready().outputs]
        unknown = [name for name in names if name not in known]
        if unknown:
            raise BadRequest(f"unknown output(s) {unknown}; model '{self.name}' returns {known}")

    def ensure_ready(self) -> ModelConfig:
        if self.config is None or self.problem is not None:
            raise Unavailable(f"model '{self.name}' is not ready: {self.problem}", retry_after=5)
        return self.config

    def statistics(self) -> dict[str, Any]:
        """Triton-style statistics: rows inferred and onnxruntime executions (batches) so far."""
        batcher = self.batcher
        return {"name": self.name, "version": VERSION,
                "inference_count": batcher.inference_count if batcher else 0,
                "execution_count": batcher.execution_count if batcher else 0}

    async def infer(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.batcher is None:
            raise Unavailable(f"model '{self.name}' is not ready: {self.problem}", retry_after=5)
        return await self.batcher.submit(inputs)


def _check_heads(given: Mapping[str, InputTensor]) -> None:
    """GQA/MQA need Hq a multiple of Hkv, and key and value must agree (checked before exact dims)."""
    query, key, value = given.get("query"), given.get("key"), given.get("value")
    if query is None or key is None or len(query.shape) != 4 or len(key.shape) != 4:
        return
    hq, hkv = query.shape[1], key.shape[1]
    if hkv == 0 or hq % hkv:
        raise BadRequest(f"query has {hq} heads and key {hkv}: Hq must be a multiple of Hkv")
    if value is not None and value.shape != key.shape:
        raise BadRequest(f"key {list(key.shape)} and value {list(value.shape)} must have the same shape")


def _check_tensor(spec: TensorSpec, tensor: InputTensor) -> None:
    where = f"input '{spec.name}'"
    if tensor.datatype != spec.datatype:
        raise BadRequest(f"{where}: datatype {tensor.datatype}, the model expects {spec.datatype}")
    if len(tensor.shape) != len(spec.shape):
        raise BadRequest(f"{where}: shape {list(tensor.shape)} has rank {len(tensor.shape)}, "
                         f"the model expects {list(spec.shape)} (-1 = any)")
    for axis, (got, want) in enumerate(zip(tensor.shape, spec.shape, strict=True)):
        if want != -1 and got != want:
            raise BadRequest(f"{where}: shape {list(tensor.shape)} does not match {list(spec.shape)} "
                             f"(dim {axis} must be {want})")
        if want == -1 and got < 1:
            raise BadRequest(f"{where}: shape {list(tensor.shape)}: dynamic dim {axis} must be >= 1")


def _check_shared_dims(specs: Sequence[TensorSpec], given: Mapping[str, InputTensor]) -> None:
    """All inputs share the batch size, and the sequence length where they have one."""
    batch = {spec.name: given[spec.name].shape[0] for spec in specs}
    if len(set(batch.values())) > 1:
        raise BadRequest(f"inputs disagree on the batch size (dim 0): {batch}")
    seq = {spec.name: given[spec.name].shape[axis] for spec in specs if (axis := spec.sequence_axis()) is not None}
    if len(set(seq.values())) > 1:
        raise BadRequest(f"inputs disagree on the sequence length: {seq}")


def _check_positions(positions: np.ndarray, max_position: int) -> None:
    bad = (positions < 0) | (positions >= max_position)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise BadRequest(f"input 'position_ids': values must be in [0, {max_position}); "
                         f"found {int(positions[where])} at index {list(where)}")


class Engine:
    """Every model of the repository, the worker threads, and one batcher per ready model."""

    def __init__(self, settings: Settings, observer: BatchObserver | None = None) -> None:
        self.settings = settings
        self.observer = observer
        self.models: dict[str, Model] = {}
        self.executor = ThreadPoolExecutor(max_workers=settings.inference_threads, thread_name_prefix="posenc-infer")

    def load(self) -> list[str]:
        """Load every `<repository>/<name>/` holding a model.onnx or a config.json; returns the readiness problems."""
        root = Path(self.settings.model_repository)
        if not root.is_dir():
            return [f"model repository {root} is not a folder"]
        entries = (p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
        for folder in sorted(p for p in entries if (p / "model.onnx").exists() or (p / "config.json").exists()):
            model = Model(folder.name, folder)
            model.load(self.settings)
            if model.config is not None and model.ready:
                model.batcher = self._batcher(model, model.config)
            self.models[model.name] = model
        if not self.models:
            return [f"model repository {root} holds no <model>/model.onnx"]
        return [m.problem for m in self.models.values() if m.problem]

    def _batcher(self, model: Model, config: ModelConfig) -> Batcher:
        max_batch = self.settings.max_batch_size or config.max_batch_size
        # Right-padding the sequence is exact only under a causal mask (padded keys come after every valid query).
        seq_axes = {s.name: s.sequence_axis() for s in config.inputs + config.outputs}
        pad = config.causal and all(axis is not None for axis in seq_axes.values())
        return Batcher(
            model.run, self.executor, max_batch_size=max_batch if self.settings.batching else 1,
            max_queue_delay_us=self.settings.max_queue_delay_us if self.settings.batching else 0,
            max_queue_size=self.settings.max_queue_size, batching=self.settings.batching,
            seq_axes={k: v for k, v in seq_axes.items() if v is not None} if pad else None, name=model.name,
            observer=self.observer,
        )

    def get(self, name: str, version: str | None = None) -> Model:
        model = self.models.get(name)
        if model is None:
            raise NotFound(f"unknown model '{name}'; known: {sorted(self.models)}")
        if version is not None and version != VERSION:
            raise NotFound(f"model '{name}' has no version '{version}'; versions: ['{VERSION}']")
        return model

    async def close(self) -> None:
        await asyncio.gather(*(m.batcher.close() for m in self.models.values() if m.batcher is not None))
        self.executor.shutdown(wait=False, cancel_futures=True)
