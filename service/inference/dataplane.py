"""The inference data plane: what a KServe v2 / Triton request needs whatever protocol carried it.

`DataPlane` owns the models' life (loading beside serving, readiness and who is told of its changes, closing),
their metadata, readiness, statistics, config and repository index, shared-memory status, register and unregister
(in a worker thread: opening an object can block), and the lifecycle of an inference and of a model check:

    admission (`admitted`: model ready? → the model's queue admits it → the caller's share of the memory budget) →
    its bytes read → a shared-memory lease → parse → inputs checked, reservation grown to the request's peak → the
    run (through the model's batcher) → copies into regions → encode → lease released; the reservation released on
    failure, or handed to the protocol with the answer (`Answered`) to hold until the answer is sent.

The admission is one step that every protocol takes before it reads a byte of a request: HTTP knows the model from
the route; a gRPC message names its model inside, so gRPC takes it twice, before the message is read (no model
named: some model ready, some ready model's queue not full, the memory the message may bring) and once it is in
(the named model's readiness and queue place, growing the same reservation).

The protocols are adapters: an `InferCall` says how their request's bytes are read, parsed and their answer encoded
(`posenc.service.inference.routes` for HTTP, `posenc.service.grpc.servicer` for gRPC) and each maps a
`ServiceError` to its own status from the taxonomy's one table (`posenc.service.errors`). Every step whose cost
grows with the request runs in a worker thread once it is large, by one rule (`offload`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from posenc.models.diagnosis.attention import AttentionSpec
from posenc.models.dtypes import BY_KSERVE
from posenc.service import __version__
from posenc.service.budget import MemoryBudget, Reservation
from posenc.service.check.attention import EXPECTED, bound_attention_work, check_attention
from posenc.service.errors import BadRequest, Unavailable
from posenc.service.inference.codecs.kserve_request import InferRequest, InputTensor, RequestedOutput, extensions
from posenc.service.inference.codecs.kserve_response import requested_outputs
from posenc.service.inference.model_inputs import check_inputs, check_outputs, model_metadata
from posenc.service.inference.runtime.calibration_child import CHILD_BYTES
from posenc.service.inference.runtime.engine import Engine
from posenc.service.inference.runtime.repository import (
    LOADING_RETRY_SECONDS,
    LoadedModel,
    RepositoryEntry,
    ensure_ready,
)
from posenc.service.inference.shared_memory.registry import RegionsFor, SharedMemoryRegistry, parse_register
from posenc.service.inference.triton_config import repository_index, triton_config
from posenc.service.request_kit import phases
from posenc.service.request_kit.restricted import SharedMemoryCaller
from posenc.service.settings import Settings

T = TypeVar("T")
A = TypeVar("A")
A_co = TypeVar("A_co", covariant=True)
Buffer = bytes | bytearray | memoryview

# The one offload rule: a step whose work (in bytes parsed or encoded: `work`) is above this runs in a worker
# thread, so the event loop keeps serving; below it the hand-off would cost more than the step.
OFFLOAD_WORK = 256 * 1024
COPY_PER_PARSED_BYTE = 32  # bytes copied in the time of one byte parsed
# The most bytes one number takes in a JSON data list: "-2.2250738585072014e-308" and its comma.
JSON_NUMBER_BYTES = 25
STARTING = "starting"  # the readiness problem before the models are listed


def work(parsed: int, copied: int = 0) -> int:
    """The work of a step in bytes parsed: text and protobuf fields are parsed, raw bytes only copied (once, about
    `COPY_PER_PARSED_BYTE` times faster)."""
    return parsed + copied // COPY_PER_PARSED_BYTE


class InferCall(Protocol[A_co]):
    """One protocol's infer (or check) request, as the plane runs it. `A` is what `encode` answers."""

    protocol: str  # "http" or "grpc": the label of its phases in the metrics
    model_name: str
    model_version: str | None
    caller: SharedMemoryCaller  # whose shared-memory regions the request may name
    reserve_bytes: int  # held before the request's bytes are read (its copies while it is parsed)
    held: Reservation | None  # what the protocol already holds for it (gRPC: its message since it arrived), grown

    async def read(self) -> Any:
        """The request's bytes, read now (HTTP) or already in memory (gRPC): what `parse` takes."""

    def parse_work(self, read: Any) -> int:
        """`work` of parsing what `read` returned."""

    def parse(self, read: Any, shared_memory: RegionsFor | None) -> tuple[InferRequest, Buffer]:
        """The parsed request, and the buffer its inputs are views of (whose bytes the request holds)."""

    def encode_work(self, request: InferRequest, outputs: Mapping[str, np.ndarray]) -> int:
        """`work` of encoding the answer to `request`."""

    def encode(self, model_name: str, request: InferRequest, outputs: Mapping[str, np.ndarray],
               order: Sequence[str]) -> A_co:
        """The protocol's answer (outputs written to shared memory are already there)."""

    def watching(self) -> AbstractAsyncContextManager[None]:
        """Held while a step of this request runs in a worker thread (HTTP: stop once the client has left)."""


class InferenceObserver(Protocol):
    """Where the plane reports each inference answered (`posenc.service.metrics.Metrics`)."""

    def observe_phases(self, model: str, protocol: str, spans: Mapping[str, float], total: float) -> None:
        """`spans`: seconds by phase (`posenc.service.request_kit.phases`), `total`: from the start to the answer."""


@dataclass
class Admitted:
    """What the admission step holds for a request: its model (None: not named yet) and its share of the memory
    budget (the caller's once the step's block ends without failing)."""

    model: LoadedModel | None
    reservation: Reservation


@dataclass
class Answered(Generic[T]):
    """An answer and the reservation that holds its bytes: the protocol releases it once the answer is sent."""

    value: T
    reservation: Reservation

    def release(self) -> None:
        self.reservation.release()


async def offload(units: int, call: InferCall[Any] | None, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`: in a worker thread (watched by `call`) when its `work` is above `OFFLOAD_WORK`, else here."""
    if units <= OFFLOAD_WORK:
        return fn(*args)
    async with call.watching() if call is not None else contextlib.nullcontext():
        return await asyncio.to_thread(fn, *args)


def memory_needed(body: Buffer, model: LoadedModel, parsed: InferRequest, inputs: Mapping[str, np.ndarray]) -> int:
    """Bytes the request holds at its peak: the body, the inputs decoded from text or fields (binary ones are views
    of the body), every output, and the JSON text of the outputs answered as JSON."""
    body_bytes = np.frombuffer(body, np.uint8)
    decoded = sum(t.array.nbytes for t in parsed.inputs
                  if t.shm is None and not np.may_share_memory(t.array, body_bytes))
    largest_input = max((array.nbytes for array in inputs.values()), default=0)
    elements = {}
    for out in model.config.outputs:
        shape = model.output_shape(out.name, inputs)
        itemsize = BY_KSERVE[out.datatype].numpy.itemsize
        elements[out.name] = math.prod(shape) if shape is not None else largest_input // itemsize
    outputs = sum(elements[out.name] * BY_KSERVE[out.datatype].numpy.itemsize for out in model.config.outputs)
    text = sum(elements.get(out.name, 0) * JSON_NUMBER_BYTES
               for out in requested_outputs(parsed, model.config.output_names) if out.shm is None and not out.binary)
    return len(body) + decoded + outputs + text


def shm_destinations(model: LoadedModel, parsed: InferRequest, inputs: Mapping[str, np.ndarray],
                     regions: RegionsFor | None) -> dict[str, np.ndarray]:
    """Views of the regions that requested outputs go to, for the model to write into directly (400 up front when
    one is too small). Outputs whose shape is known only after the run, or that cannot be written in place (see
    `SharedMemoryRegistry.output_array`), are copied there afterwards."""
    if regions is None:
        return {}
    input_refs = [tensor.shm for tensor in parsed.inputs if tensor.shm is not None]
    datatypes = {tensor.name: tensor.datatype for tensor in model.config.outputs}
    views = {}
    for out in requested_outputs(parsed, model.config.output_names):
        shape = model.output_shape(out.name, inputs)
        if out.shm is None or shape is None:
            continue
        view = regions.output_array(out.shm, BY_KSERVE[datatypes[out.name]].numpy, shape, f"output '{out.name}'",
                                    input_refs)
        if view is not None:
            views[out.name] = view
    return views


def copied_to_shm(parsed: InferRequest, outputs: Mapping[str, np.ndarray], written: Mapping[str, np.ndarray],
                  order: Sequence[str]) -> list[RequestedOutput]:
    """The shared-memory outputs the run did not write into their regions itself: copied there before encoding."""
    return [out for out in requested_outputs(parsed, order)
            if out.shm is not None and outputs[out.name] is not written.get(out.name)]


def split_expected(tensors: Sequence[InputTensor]) -> tuple[list[InputTensor], np.ndarray]:
    """A check's model inputs, and the user's output (400 when it is missing)."""
    expected = [t for t in tensors if t.name == EXPECTED]
    if len(expected) != 1:
        raise BadRequest(f"add your output as the input tensor '{EXPECTED}' (same shape and datatype as the model's "
                         "output), once")
    return [t for t in tensors if t.name != EXPECTED], expected[0].array


Step = Callable[[LoadedModel, InferRequest, Buffer, "RegionsFor | None", Reservation], Awaitable[T]]


class DataPlane:
    """The models and shared memory of one process, served to every protocol. `problems` is why the server is not
    ready (empty: ready), kept current as the models load."""

    def __init__(self, engine: Engine, settings: Settings, budget: MemoryBudget, shared_memory: SharedMemoryRegistry,
                 *, problems: list[str] | None = None, observer: InferenceObserver | None = None) -> None:
        self.engine, self.settings, self.budget, self.shared_memory = engine, settings, budget, shared_memory
        self.observer = observer
        self.problems: list[str] = problems if problems is not None else [STARTING]  # one list, kept current
        self._watchers: list[Callable[[], Awaitable[None]]] = []
        self._loader: asyncio.Task[None] | None = None

    # -- the models' life

    def watch(self, changed: Callable[[], Awaitable[None]]) -> None:
        """Call `changed()` whenever a model is loaded or fails (a transport's health follows the readiness)."""
        self._watchers.append(changed)

    async def _changed(self) -> None:
        engine = self.engine
        self.problems[:] = engine.problems() if engine.loaded or engine.models else [STARTING]
        for changed in list(self._watchers):
            await changed()

    async def start(self, *, in_background: bool) -> None:
        """Load the models: now (every model loaded when this returns), or `in_background` (each model ready once
        loaded; its CPU-graph calibration holds `CHILD_BYTES` of the budget while it runs)."""
        if in_background:
            self._loader = asyncio.create_task(self.engine.load_in_background(
                lambda: self.budget.hold(CHILD_BYTES, "the CPU-graph calibration of a model"), self._changed))
        else:
            await asyncio.to_thread(self.engine.load)
            await self._changed()

    async def close(self) -> None:
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
        await self.engine.close()
        self.shared_memory.close()  # unmap every registered region

    # -- what the server and its models say of themselves

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "posenc", "version": __version__, "extensions": extensions(self.settings.shared_memory)}

    def model(self, name: str, version: str | None = None) -> RepositoryEntry:
        """The model (404 naming the model or version when there is none)."""
        return self.engine.get(name, version or None)

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        return model_metadata(self.model(name, version))

    def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """Triton's model_config as JSON (503 while the model loads)."""
        return triton_config(ensure_ready(self.model(name, version)), self.settings)

    def statistics(self, name: str | None = None, version: str | None = None) -> list[dict[str, Any]]:
        """The statistics of one model, or of every model (Triton: no name = every model)."""
        engine = self.engine
        entries = [self.model(name, version)] if name else [engine.models[key] for key in sorted(engine.models)]
        return [engine.statistics(entry) for entry in entries]

    def repository_index(self, ready_only: bool) -> list[dict[str, str]]:
        return repository_index(self.engine.models, ready_only)

    # -- system shared memory (`what`: the route or method, for a refusal's message)

    def require_shared_memory(self, caller: SharedMemoryCaller, what: str) -> SharedMemoryRegistry:
        """The registry, or 400 saying how to turn the extension on; 403 for a caller that may not use it."""
        self.shared_memory.require_enabled()
        caller.require(what)
        return self.shared_memory

    async def shared_memory_status(self, caller: SharedMemoryCaller, name: str | None, what: str
                                   ) -> list[dict[str, Any]]:
        registry = self.require_shared_memory(caller, what)
        return await asyncio.to_thread(registry.status, caller, name or None)

    async def register(self, caller: SharedMemoryCaller, name: str, body: Any, what: str) -> None:
        """Register `name` from a register body (`{"key", "offset", "byte_size"}`, checked here)."""
        registry = self.require_shared_memory(caller, what)
        key, offset, byte_size = parse_register(body)
        await asyncio.to_thread(registry.register, name, key, offset, byte_size, caller)

    async def unregister(self, caller: SharedMemoryCaller, name: str | None, what: str) -> None:
        """Unregister `name`, or every region of `caller` (None)."""
        registry = self.require_shared_memory(caller, what)
        await asyncio.to_thread(registry.unregister, caller, name or None)

    # -- inference and the model check

    async def infer(self, call: InferCall[A]) -> Answered[A]:
        """Run an infer request; its answer, holding the reservation of its bytes."""
        async def step(model: LoadedModel, parsed: InferRequest, body: Buffer, regions: RegionsFor | None,
                       reservation: Reservation) -> A:
            outputs, written = await self._run(model, parsed, body, regions, reservation)
            del body  # the inputs were views of it, not needed any more
            order = model.config.output_names
            copies = copied_to_shm(parsed, outputs, written, order)
            units = work(0, sum(outputs[out.name].nbytes for out in copies)) + call.encode_work(parsed, outputs)
            return await offload(units, call, self._answer, call, model.name, regions, parsed, outputs, copies, order)

        answered = await self._serve(call, "an inference", step, shared_memory=True)
        timed = phases.current()
        if self.observer is not None and timed is not None:
            self.observer.observe_phases(call.model_name, call.protocol, timed.spans, timed.total())
        return answered

    async def check(self, call: InferCall[Any]) -> Answered[dict[str, Any]]:
        """Run a check request (an infer request whose inputs also hold `EXPECTED`, the user's output for them):
        the model's output compared with the user's, the causes ranked; the report."""
        async def step(model: LoadedModel, parsed: InferRequest, body: Buffer, regions: RegionsFor | None,
                       reservation: Reservation) -> dict[str, Any]:
            tensors, expected = split_expected(parsed.inputs)
            inputs = check_inputs(model, tensors)
            bound_attention_work(AttentionSpec.from_config(model.config.raw), inputs, self.settings.max_table_bytes)
            # the body, its decoded tensors and the output, the diagnosis's copies, and the run in onnxruntime
            await reservation.grow(3 * len(body) + self.engine.run_memory(model, inputs), f"a check on '{model.name}'")
            output = (await self.engine.infer(model, inputs))[model.config.output_names[0]]
            report = await asyncio.to_thread(check_attention, model.name, model.config.raw, inputs, output, expected)
            return report.document()

        return await self._serve(call, "a check", step, shared_memory=False)

    @contextlib.asynccontextmanager
    async def admitted(self, model_name: str | None, version: str | None, reserve_bytes: int, kind: str, *,
                       held: Reservation | None = None, line: bool = True, lent: bool = False
                       ) -> AsyncIterator[Admitted]:
        """The admission step, taken before a byte of the request's body or message is read, so that what cannot
        run is refused before it costs memory or time: the model's readiness (503 naming why), a place in its queue
        (503 when full; held while the block runs), then the caller's share of the memory budget: `reserve_bytes`
        (at most the whole budget: a request larger runs alone; `held`: a reservation the caller holds already,
        grown in place), waited for as `MemoryBudget.acquire` waits (`line=False`: not in POSENC_MEMORY_WAITERS, the
        caller's own limit bounds how many wait; `lent`: the caller will lend it, `Reservation.lend`). The share is
        released if the block fails, else it stays the caller's (handed on with the answer).

        `model_name` None: the model is named inside what is about to be read (a gRPC message). 503 while no model
        is ready, or while every ready model's queue is full; no place is held (the named model's is taken once
        the message is in, by this step again)."""
        model = None
        if model_name is None:
            self._some_model_admits()
            what = kind
        else:
            model = ensure_ready(self.model(model_name, version))
            what = f"{kind} on '{model.name}'"
        with self.engine.admission(model) if model is not None else contextlib.nullcontext():
            if held is None:
                reservation = await self.budget.acquire(reserve_bytes, what, line=line, lent=lent)
            else:  # grown in place: one reservation, at most the whole budget, as a request that runs alone
                await held.grow(reserve_bytes, what)
                reservation = held
            try:
                yield Admitted(model, reservation)
            except BaseException:
                reservation.release()
                raise

    def _some_model_admits(self) -> None:
        """503 when no model could take a request now: none is ready (the readiness problems say why), or every
        ready model's queue is full (the model's own refusal when there is one model)."""
        engine = self.engine
        if engine is None:  # a plane without models: the transports' own tests, which say it is ready
            return
        ready = [entry for entry in engine.models.values() if isinstance(entry, LoadedModel)]
        if not ready:
            raise Unavailable("not ready: " + ("; ".join(self.problems) or "no model is loaded"),
                              retry_after=LOADING_RETRY_SECONDS)
        refused: Unavailable | None = None
        for model in ready:
            try:
                with engine.admission(model):  # a place free now (given back at once: the message names its model)
                    return
            except Unavailable as exc:
                refused = exc
        if len(ready) == 1 and refused is not None:
            raise refused
        raise Unavailable(f"every model's queue is full (POSENC_MAX_QUEUE_SIZE={self.settings.max_queue_size}); "
                          "retry later", retry_after=1, overloaded=True)

    async def _serve(self, call: InferCall[Any], kind: str, step: Step[T], *, shared_memory: bool) -> Answered[T]:
        """The lifecycle around `step`: the admission (readiness, the model's queue, the reservation), the read, the
        lease, the parse; the lease released always, the reservation on failure."""
        async with self.admitted(call.model_name, call.model_version, call.reserve_bytes, kind,
                                 held=call.held) as admitted:
            model, reservation = admitted.model, admitted.reservation
            assert model is not None
            phases.lap("admit")
            read = await call.read()
            phases.lap("read")
            regions = (self.shared_memory.for_caller(call.caller)
                       if shared_memory and self.shared_memory.enabled else None)
            try:
                parsed, body = await offload(call.parse_work(read), call, call.parse, read, regions)
                del read
                phases.lap("parse")
                value = await step(model, parsed, body, regions, reservation)
            finally:
                if regions is not None:
                    regions.release()
            phases.lap("encode")
        return Answered(value, reservation)

    async def _run(self, model: LoadedModel, parsed: InferRequest, body: Buffer, regions: RegionsFor | None,
                   reservation: Reservation) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Inputs and requested outputs checked against the model, the reservation grown to what the request holds at
        its peak plus its run inside onnxruntime (the attention scores), shared-memory outputs written in place
        where they can be: the outputs, and the views of the regions the run wrote. The request's inputs are
        dropped: views of the body or of shared memory (a region unregistered meanwhile unmaps once unused)."""
        inputs = check_inputs(model, parsed.inputs)
        if parsed.outputs is not None:
            check_outputs(model, [out.name for out in parsed.outputs])
        needed = memory_needed(body, model, parsed, inputs) + self.engine.run_memory(model, inputs)
        await reservation.grow(needed, f"an inference on '{model.name}'")
        written = shm_destinations(model, parsed, inputs, regions)
        outputs = await self.engine.infer(model, inputs, written)
        parsed.inputs = []
        phases.lap("queue")
        return outputs, written

    @staticmethod
    def _answer(call: InferCall[A], model_name: str, regions: RegionsFor | None, parsed: InferRequest,
                outputs: dict[str, np.ndarray], copies: Sequence[RequestedOutput], order: Sequence[str]) -> A:
        """Copy the `copies` into their regions, then encode the answer."""
        for out in copies:
            if out.shm is not None and regions is not None:
                regions.write_output(out.shm, outputs[out.name], f"output '{out.name}'")
        return call.encode(model_name, parsed, outputs, order)
