"""Serving the model repository: one onnxruntime session and one batcher per ready model.

`service.inference.repository` loads and checks the models; this module runs them. `run` is called from
worker threads (onnxruntime releases the GIL). Nothing here knows the wire protocol: the KServe v2
view of a model (metadata, request checks) is `service.inference.model_inputs`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from service.budget import MemoryBudget
from service.errors import NotFound, PayloadTooLarge, Unavailable
from service.inference.batcher import Batcher, BatchObserver
from service.inference.devices import CUDA
from service.inference.repository import FailedModel, LoadedModel, load_model, model_folders
from service.inference.run_bound import AttentionCost, attention_cost, default_run_bytes
from service.settings import Settings

VERSION = "1"
RepositoryEntry = LoadedModel | FailedModel


def ensure_ready(model: RepositoryEntry) -> LoadedModel:
    """The loaded model, or 503 naming why it cannot be served."""
    if isinstance(model, FailedModel):
        raise Unavailable(f"model '{model.name}' is not ready: {model.problem}", retry_after=5)
    return model


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

    def load(self) -> list[str]:
        """Load every model of the repository; returns the readiness problems (empty: ready)."""
        root = Path(self.settings.model_repository)
        if not root.is_dir():
            return [f"model repository {root} is not a folder"]
        for folder in model_folders(root):
            self.models[folder.name] = load_model(folder.name, folder, self.settings)
        loaded = [model for model in self.models.values() if isinstance(model, LoadedModel)]
        if not self.settings.max_run_bytes:
            self.run_budget.capacity = default_run_bytes(on_cuda=any(CUDA in m.providers for m in loaded))
        for model in loaded:
            if (cost := attention_cost(model.config.raw)) is not None:
                self.costs[model.name] = cost
            self.batchers[model.name] = self._batcher(model)
        if not self.models:
            return [f"model repository {root} holds no <model>/model.onnx"]
        return [m.problem for m in self.models.values() if isinstance(m, FailedModel)]

    def _batcher(self, model: LoadedModel) -> Batcher:
        config, settings = model.config, self.settings
        max_batch = settings.max_batch_size or config.max_batch_size
        # Right-padding the sequence is exact only under a causal mask (padded keys come after every valid query).
        seq_axes = {t.name: t.sequence_axis() for t in config.inputs + config.outputs}
        pad = config.causal and all(axis is not None for axis in seq_axes.values())
        cost = self.costs.get(model.name)
        return Batcher(
            model.run, self.executor,
            max_batch_size=max_batch, max_queue_delay_us=settings.max_queue_delay_us,
            max_queue_size=settings.max_queue_size, batching=settings.batching,
            seq_axes={k: v for k, v in seq_axes.items() if v is not None}, pad=pad, name=model.name,
            observer=self.observer, run_bytes=cost.run_bytes if cost else None,
            run_budget=self.run_budget if cost else None,
        )

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
        return await self.batchers[model.name].run_admitted(inputs, out)

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
        await asyncio.gather(*(batcher.close() for batcher in self.batchers.values()))
        self.executor.shutdown(wait=False, cancel_futures=True)
