"""The engine: runs the repository's models, one onnxruntime session and one batcher per ready model.

`run_model` is one onnxruntime run (called from worker threads: onnxruntime releases the GIL), with
the inputs and outputs bound to the device where that saves copies and a failed allocation answered
as a 507; `Engine` holds every model of the repository (loaded by `posenc.service.inference.runtime.repository`)
and feeds each ready model through its batcher within the run bound. Nothing here knows the wire
protocol: the KServe v2 view of a model (metadata, request checks) is `posenc.service.inference.model_inputs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort

from posenc.service.budget import MemoryBudget
from posenc.service.errors import InsufficientStorage, NotFound, PayloadTooLarge
from posenc.service.inference.runtime.arena import IdleShrinker, one_position
from posenc.service.inference.runtime.batcher import Batcher, BatchObserver
from posenc.service.inference.runtime.calibration_child import stop_children
from posenc.service.inference.runtime.devices import CPU, CUDA
from posenc.service.inference.runtime.repository import (
    ORT_ERRORS,
    VERSION,
    FailedModel,
    LoadedModel,
    LoadingModel,
    RepositoryEntry,
    load_model,
    loading,
    model_folders,
)
from posenc.service.inference.runtime.run_bound import AttentionCost, attention_cost, default_run_bytes
from posenc.service.settings import Settings

log = logging.getLogger("posenc.inference.engine")

# How onnxruntime reports a failed allocation (its BFC arena, the CUDA allocator, std::bad_alloc on CPU).
ALLOCATION_FAILURE = re.compile(r"failed to allocate|out of memory|bad.alloc|cudaErrorMemoryAllocation", re.IGNORECASE)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# onnx TensorProto.BFLOAT16: onnxruntime's numpy bridge has no bfloat16 type, so such tensors go in as their
# uint16 bit patterns labelled with this element type, and come out through the OrtValue's buffer.
ONNX_BFLOAT16 = 16


def run_model(model: LoadedModel, inputs: Mapping[str, np.ndarray],
              out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Synchronous onnxruntime run returning every output in model order (call from a worker thread).

    `out`: arrays some outputs are written into (each of the output's shape and dtype, C-contiguous, not
    overlapping the inputs), returned as themselves (an output of another shape is returned as it is).
    onnxruntime writes into them directly, bound as its output buffers: on CPU the run writes there, on CUDA
    the output is copied there from the device (one copy; a pinned region's by DMA).
    An allocation that fails inside onnxruntime is a 507 (`InsufficientStorage`); the session keeps working."""
    names = model.config.output_names
    bound = model.io_binding if model.io_binding is not None else CUDA in model.providers
    session = model.forms.pick(inputs)[1] if model.forms is not None else model.session
    try:
        result = _run_bfloat16(model, session, inputs) if _has_bfloat16(model, inputs) else None
        if result is None and out:
            result = _run_into(model, session, inputs, out)
        if result is None:
            outputs = _run_bound(model, session, inputs) if bound else session.run(names, dict(inputs))
            result = dict(zip(names, outputs, strict=True))
    except MemoryError:
        raise _out_of_memory(model, "MemoryError") from None
    except ORT_ERRORS as exc:
        if ALLOCATION_FAILURE.search(str(exc)):
            raise _out_of_memory(model, str(exc).strip().splitlines()[-1]) from None
        raise
    for name, target in (out or {}).items():
        if result[name] is not target and result[name].shape == target.shape:
            np.copyto(target, result[name])
            result[name] = target
    return result


def _binding(session: ort.InferenceSession, inputs: Mapping[str, np.ndarray]) -> ort.IOBinding:
    """An I/O binding with `inputs` bound from host memory (onnxruntime copies them to the device if needed)."""
    binding = session.io_binding()
    for name, array in inputs.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(array))
    return binding


def _run_bound(model: LoadedModel, session: ort.InferenceSession,
               inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    device = "cuda" if CUDA in model.providers else "cpu"
    binding = _binding(session, inputs)
    for name in model.config.output_names:
        binding.bind_output(name, device)
    session.run_with_iobinding(binding)
    return list(binding.copy_outputs_to_cpu())


def _run_into(model: LoadedModel, session: ort.InferenceSession, inputs: Mapping[str, np.ndarray],
              out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """A run with the outputs of `out` bound to those host arrays (onnxruntime's output buffers: written in place
    on CPU, copied into from the device on CUDA), the others returned in host memory; None when onnxruntime
    refuses them (an output whose real shape differs from its declared symbolic dims)."""
    binding = _binding(session, inputs)
    names = model.config.output_names
    for name in names:
        if name in out:
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(out[name]))
        else:
            binding.bind_output(name, "cpu")
    try:
        session.run_with_iobinding(binding)
    except ORT_ERRORS as exc:
        if ALLOCATION_FAILURE.search(str(exc)):
            raise
        log.warning("model %s: onnxruntime refused the bound output buffers (%s); running unbound",
                    model.name, str(exc).strip().splitlines()[-1])
        return None
    values = binding.get_outputs()  # in the order bound: the model's
    return {name: out[name] if name in out else value.numpy() for name, value in zip(names, values, strict=True)}


def _has_bfloat16(model: LoadedModel, inputs: Mapping[str, np.ndarray]) -> bool:
    return (any(array.dtype == BFLOAT16 for array in inputs.values())
            or any(tensor.datatype == "BF16" for tensor in model.config.outputs))


def _ortvalue(array: np.ndarray) -> ort.OrtValue:
    array = np.ascontiguousarray(array)
    if array.dtype == BFLOAT16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array.view(np.uint16), ONNX_BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(array)


def _host_array(value: ort.OrtValue) -> np.ndarray:
    """A host copy of an output OrtValue; bfloat16 is copied out of its buffer while `value` still holds it."""
    if value.data_type() != "tensor(bfloat16)":
        return value.numpy()
    shape = tuple(value.shape())
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, BFLOAT16)
    bits = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(bits, dtype=np.uint16).copy().view(BFLOAT16).reshape(shape)


def _run_bfloat16(model: LoadedModel, session: ort.InferenceSession,
                  inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A run whose inputs or outputs include bfloat16 (any device: outputs come back to host memory)."""
    binding = session.io_binding()
    for name, array in inputs.items():
        binding.bind_ortvalue_input(name, _ortvalue(array))
    names = model.config.output_names
    for name in names:
        binding.bind_output(name, "cpu")
    session.run_with_iobinding(binding)
    return {name: _host_array(value) for name, value in zip(names, binding.get_outputs(), strict=True)}


def _out_of_memory(model: LoadedModel, detail: str) -> InsufficientStorage:
    log.error("model %s: onnxruntime could not allocate memory for a run (%s)", model.name, detail)
    return InsufficientStorage(
        f"model '{model.name}' ran out of memory on {model.providers[0]} for this request ({detail}); "
        "lower POSENC_MAX_RUN_BYTES so such requests get a 413 up front, or retry with fewer rows or a shorter "
        "sequence")


class Engine:
    """Every model of the repository, the worker threads, and one batcher per ready model."""

    def __init__(self, settings: Settings, observer: BatchObserver | None = None) -> None:
        self.settings = settings
        self.observer = observer
        self.models: dict[str, RepositoryEntry] = {}
        self.batchers: dict[str, Batcher] = {}
        self.costs: dict[str, AttentionCost] = {}
        # Bytes the runs of every model may hold together (resolved from the provider once models are loaded).
        self.run_budget = MemoryBudget(settings.max_run_bytes or default_run_bytes(on_cuda=False), max_waiters=1 << 30,
                                       wait_seconds=None, setting="POSENC_MAX_RUN_BYTES")
        self.executor = ThreadPoolExecutor(max_workers=settings.inference_threads, thread_name_prefix="posenc-infer")
        self.loaded = False  # every model loaded (or failed): `load_in_background` has finished
        # the CPU arenas of a model idle for a while handed back (`posenc.service.inference.runtime.arena`)
        self.shrinker = IdleShrinker(self.executor, lambda name: self.batchers[name].busy)
        self._arena_runs: dict[str, tuple[list[ort.InferenceSession], dict[str, np.ndarray]]] = {}

    def load(self) -> list[str]:
        """Load every model of the repository, one after the other; returns the readiness problems (empty: ready)."""
        folders = self.begin_loading()
        deadline = time.monotonic() + self.settings.calibration_seconds  # the CPU-form calibration of every model
        for folder in folders:
            self.install(load_model(folder.name, folder, self.settings, deadline))
        self.loaded = True
        return self.problems()

    async def load_in_background(self, hold_memory: Callable[[], AbstractAsyncContextManager[None]],
                                 on_change: Callable[[], Awaitable[None]]) -> None:
        """`load` beside serving: every model is listed at once as loading (503 with Retry-After), then each is
        installed as soon as it is loaded, `on_change` called after each. A model whose CPU graphs are calibrated
        runs its timings in a child process (`calibration_child`) inside `hold_memory()`, the child's share of
        the memory budget."""
        folders = self.begin_loading()
        await on_change()
        deadline = time.monotonic() + self.settings.calibration_seconds
        for folder in folders:
            async with hold_memory() if self._may_calibrate(folder) else contextlib.nullcontext():
                entry = await asyncio.to_thread(load_model, folder.name, folder, self.settings, deadline)
            self.install(entry)
            await on_change()
        self.loaded = True
        await on_change()

    def _may_calibrate(self, folder: Path) -> bool:
        """Whether loading this model may time its graphs (it has CPU forms and the rule is calibrated; the cache
        may still answer): cheap, read before the load."""
        return self.settings.cpu_form_from == "calibrate" and any(folder.glob("model.*.onnx"))

    def begin_loading(self) -> list[Path]:
        """The repository's model folders, each model listed as loading (none when the repository is no folder)."""
        root = Path(self.settings.model_repository)
        folders = list(model_folders(root)) if root.is_dir() else []
        self.models = {folder.name: loading(folder.name) for folder in folders}
        return folders

    def install(self, entry: RepositoryEntry) -> None:
        """Serve a model just loaded (its batcher and run cost), or record why it cannot be served."""
        if isinstance(entry, LoadedModel):
            if not self.settings.max_run_bytes:
                self.run_budget.capacity = default_run_bytes(on_cuda=self.on_cuda or CUDA in entry.providers)
            if (cost := attention_cost(entry.config.raw)) is not None:
                self.costs[entry.name] = cost
            self.batchers[entry.name] = self._batcher(entry)
            if entry.providers == [CPU]:
                sessions = list(entry.forms.sessions.values()) if entry.forms else [entry.session]
                inputs = one_position({t.name: (t.datatype, t.shape) for t in entry.config.inputs})
                self._arena_runs[entry.name] = (sessions, inputs)
        self.models[entry.name] = entry

    def problems(self) -> list[str]:
        """Why the service is not ready (empty: every model loaded)."""
        root = Path(self.settings.model_repository)
        if not root.is_dir():
            return [f"model repository {root} is not a folder"]
        if not self.models:
            return [f"model repository {root} holds no <model>/model.onnx"]
        loading_now = [name for name, model in self.models.items() if isinstance(model, LoadingModel)]
        if loading_now:
            return [f"loading models: {len(self.models) - len(loading_now)} of {len(self.models)} ready, "
                    f"waiting for {', '.join(loading_now)}"]
        return [m.problem for m in self.models.values() if isinstance(m, FailedModel)]

    def _batcher(self, model: LoadedModel) -> Batcher:
        config, settings = model.config, self.settings
        max_batch = settings.max_batch_size or config.max_batch_size
        # Right-padding the sequence is exact only under a causal mask (padded keys come after every valid query).
        seq_axes = {t.name: t.sequence_axis() for t in config.inputs + config.outputs}
        pad = config.causal and all(axis is not None for axis in seq_axes.values())
        cost = self.costs.get(model.name)
        return Batcher(
            functools.partial(run_model, model), self.executor,
            max_batch_size=max_batch, max_queue_delay_us=settings.max_queue_delay_us,
            max_queue_size=settings.max_queue_size, batching=settings.batching,
            seq_axes={k: v for k, v in seq_axes.items() if v is not None}, pad=pad, name=model.name,
            observer=self.observer, run_bytes=cost.run_bytes if cost else None,
            run_budget=self.run_budget if cost else None, inline_run_us=settings.inline_run_us,
            max_runs=settings.inference_threads,
            batch_below_us=0 if CUDA in model.providers else settings.batch_below_us,
        )

    @property
    def on_cuda(self) -> bool:
        """Whether a loaded model runs on the CUDA provider."""
        return any(isinstance(m, LoadedModel) and CUDA in m.providers for m in self.models.values())

    def get(self, name: str, version: str | None = None) -> RepositoryEntry:
        model = self.models.get(name)
        if model is None:
            raise NotFound(f"unknown model '{name}'; known: {sorted(self.models)}")
        if version is not None and version != VERSION:
            raise NotFound(f"model '{name}' has no version '{version}'; versions: ['{VERSION}']")
        return model

    def admission(self, model: LoadedModel) -> AbstractContextManager[None]:
        """A place in the model's queue for one request, from before its body is read (503 when full)."""
        return self.batchers[model.name].admission()

    async def infer(self, model: LoadedModel, inputs: Mapping[str, np.ndarray],
                    out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run validated inputs of an admitted request through the model's batcher (413 when one row is over the
        run bound: checked before anything runs); the outputs named in `out` are written into those arrays."""
        self.check_run(model, inputs)
        try:
            return await self.batchers[model.name].run_admitted(inputs, out)
        finally:
            if (arena := self._arena_runs.get(model.name)) is not None:
                self.shrinker.ran(model.name, *arena)

    def run_memory(self, model: LoadedModel, inputs: Mapping[str, np.ndarray]) -> int:
        """Bytes the run of these inputs holds inside onnxruntime (the attention scores of all its rows; 0 for a
        model without a cost model), for the request's memory budget reservation."""
        cost = self.costs.get(model.name)
        found = next(((inputs[t.name].shape, axis) for t in model.config.inputs
                      if (axis := t.sequence_axis()) is not None and t.name in inputs), None)
        if cost is None or found is None:
            return 0
        shape, axis = found
        return cost.run_bytes(int(shape[0]) if axis > 0 else 1, int(shape[axis]))

    def check_run(self, model: LoadedModel, inputs: Mapping[str, np.ndarray]) -> None:
        """413 when a single row of these inputs needs more memory in one run than POSENC_MAX_RUN_BYTES allows."""
        cost = self.costs.get(model.name)
        seq = next((int(inputs[t.name].shape[axis]) for t in model.config.inputs
                    if (axis := t.sequence_axis()) is not None and t.name in inputs), None)
        if cost is None or seq is None:
            return
        need, limit = cost.run_bytes(1, seq), self.run_budget.capacity
        if need > limit:
            origin = "" if self.settings.max_run_bytes else ", derived from the provider's memory"
            raise PayloadTooLarge(
                f"model '{model.name}': one row of sequence length {seq} needs {need:,} bytes of attention scores "
                f"({cost.heads} heads × {seq}² × 2 float32 copies); one run may hold {limit:,} bytes "
                f"(POSENC_MAX_RUN_BYTES{origin}); the longest sequence that fits is {cost.largest_seq(limit)}")

    def statistics(self, model: RepositoryEntry) -> dict[str, Any]:
        """Triton-style statistics: rows inferred and onnxruntime executions (batches) so far."""
        batcher = self.batchers.get(model.name)
        return {"name": model.name, "version": VERSION,
                "inference_count": batcher.inference_count if batcher else 0,
                "execution_count": batcher.execution_count if batcher else 0}

    async def close(self) -> None:
        stop_children()  # a calibration still running when the server stops
        await self.shrinker.close()
        await asyncio.gather(*(batcher.close() for batcher in self.batchers.values()))
        self.executor.shutdown(wait=False, cancel_futures=True)
