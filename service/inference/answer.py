"""The infer answering path over HTTP: admission, one aligned buffer for the body, parsing (in a worker
thread when large), validation against the model, the memory the request holds at its peak, the run through
the model's batcher, shared-memory outputs written in place, and the answer sent as the JSON header plus
views of the outputs. The routes (`posenc.service.inference.routes`) only declare it."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from posenc.models.dtypes import BY_KSERVE
from posenc.service.budget import MemoryBudget, Reservation
from posenc.service.request_kit import phases
from posenc.service.inference.runtime.engine import Engine
from posenc.service.inference.codecs.kserve_json import CLIENT_GONE
from posenc.service.inference.codecs.kserve_request import HEADER_LENGTH, InferRequest, RequestedOutput, parse_infer_request
from posenc.service.inference.codecs.kserve_response import encode_infer_response_parts, requested_outputs
from posenc.service.inference.model_inputs import check_inputs, check_outputs
from posenc.service.inference.runtime.repository import VERSION, LoadedModel, RepositoryEntry, ensure_ready
from posenc.service.inference.shared_memory.registry import RegionsFor, SharedMemoryRegistry
from posenc.service.request_kit.bodies import declared_length, read_aligned_body, receive_into_of
from posenc.service.request_kit.restricted import shared_memory_caller
from posenc.service.request_kit.sending import HeldResponse
from posenc.service.settings import Settings

# Bodies above this are parsed / encoded in a worker thread so the event loop keeps serving.
OFFLOAD_BYTES = 256 * 1024
T = TypeVar("T")


@dataclass(frozen=True)
class InferContext:
    """What an infer request uses besides its model: the engine, the limits and budget, the shared memory."""

    engine: Engine
    settings: Settings
    budget: MemoryBudget
    shared_memory: SharedMemoryRegistry


async def parse_watched(request: Request, size: int, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, a parse of `size` bytes: in a worker thread when large, and then stopped (a 499) as soon
    as the client leaves (`CLIENT_GONE`), instead of parsing a body nobody waits for."""
    if size <= OFFLOAD_BYTES:
        return fn(*args)
    gone = threading.Event()
    watcher = asyncio.create_task(_watch_disconnect(request.receive, gone))
    token = CLIENT_GONE.set(gone.is_set)  # copied into the worker thread's context
    try:
        return await asyncio.to_thread(fn, *args)
    finally:
        CLIENT_GONE.reset(token)
        watcher.cancel()


async def _watch_disconnect(receive: Receive, gone: threading.Event) -> None:
    """Set `gone` when the client disconnects (the body has been read: nothing else comes from `receive`)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


async def maybe_offload(size: int, fn: Callable[..., T], *args: Any) -> T:
    if size > OFFLOAD_BYTES:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def infer(request: Request, entry: RepositoryEntry, context: InferContext) -> Response:
    """Admit, read, parse and validate everything, run through the model's batcher, encode the outputs."""
    timed = phases.started(context.settings.server_timing, request.scope.get(phases.HEAD_AT))
    phases.lap("route")
    model = ensure_ready(entry)  # 503 before reading a body that cannot be served
    engine, limit = context.engine, context.settings.max_request_bytes
    # held until the answer is encoded: the body, the outputs (as large as the query) and their encoding
    # (grown once the inputs are parsed, when the outputs and their JSON text need more: `memory_needed`)
    reserved = 3 * declared_length(request.headers.get("content-length"), limit)
    with engine.admission(model):  # a full queue refuses before the body is read
        reservation = await context.budget.acquire(reserved, f"an inference on '{model.name}'")
        phases.lap("admit")
        try:
            parts, headers = await _run_infer(request, engine, model, limit, context.shared_memory, reservation)
        except BaseException:
            reservation.release()
            raise
    # the answer's bytes stay counted until the kernel has them (posenc.service.request_kit.sending)
    reservation.shrink(sum(len(part) for part in parts))
    if timed is not None:
        headers[phases.HEADER] = timed.value()
    return PartsResponse(parts, headers, release=reservation.release)


class PartsResponse(HeldResponse):
    """A response whose body is sent as its parts, one ASGI message each (the JSON header, then views of the
    output arrays): nothing is joined into a new buffer. `headers` carry Content-Length and Content-Type;
    `release` runs once every part is sent."""

    def __init__(self, parts: Sequence[bytes | bytearray | memoryview], headers: dict[str, str], *,
                 release: Callable[[], None]) -> None:
        super().__init__(b"", release=release, headers=headers)
        self.parts = parts

    async def send_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        last = len(self.parts) - 1
        for index, part in enumerate(self.parts):
            await send({"type": "http.response.body", "body": part, "more_body": index < last})


# The most bytes one number takes in a JSON data list: "-2.2250738585072014e-308" and its comma.
JSON_NUMBER_BYTES = 25


def memory_needed(body: bytes | bytearray | memoryview, model: LoadedModel, parsed: InferRequest,
                   inputs: Mapping[str, np.ndarray]) -> int:
    """Bytes the request holds at its peak: the body, the inputs decoded from JSON (binary ones are views of
    the body), every output, and the JSON text of the outputs answered as JSON."""
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


def _header_length(value: str | None) -> int:
    """Where the binary section starts, for aligning the body buffer (the parser checks the header itself)."""
    ok = value is not None and value.isascii() and value.isdigit() and len(value) <= 18  # int() caps digits
    return int(value) if ok and value is not None else 0


def shm_destinations(model: LoadedModel, parsed: InferRequest, inputs: Mapping[str, np.ndarray],
                      registry: RegionsFor | None) -> dict[str, np.ndarray]:
    """Views of the regions that requested outputs go to, for the model to write into directly (400 up front
    when one is too small). Outputs whose shape is known only after the run, or that cannot be written in
    place (see `SharedMemoryRegistry.output_array`), are copied there afterwards."""
    if registry is None:
        return {}
    input_refs = [tensor.shm for tensor in parsed.inputs if tensor.shm is not None]
    datatypes = {tensor.name: tensor.datatype for tensor in model.config.outputs}
    views = {}
    for out in requested_outputs(parsed, model.config.output_names):
        shape = model.output_shape(out.name, inputs)
        if out.shm is None or shape is None:
            continue
        view = registry.output_array(out.shm, BY_KSERVE[datatypes[out.name]].numpy, shape, f"output '{out.name}'",
                                     input_refs)
        if view is not None:
            views[out.name] = view
    return views


def copied_to_shm(parsed: InferRequest, outputs: dict[str, Any], written: Mapping[str, np.ndarray],
                   order: Sequence[str]) -> list[RequestedOutput]:
    """The shared-memory outputs the run did not write into their regions itself: copied there by `_answer`."""
    return [out for out in requested_outputs(parsed, order)
            if out.shm is not None and outputs[out.name] is not written.get(out.name)]


def _answer(model_name: str, registry: RegionsFor | None, parsed: InferRequest,
            outputs: dict[str, Any], copies: Sequence[RequestedOutput],
            order: Sequence[str]) -> tuple[list[bytes | bytearray | memoryview], dict[str, str]]:
    """Copy the `copies` into their regions, encode the rest: the body parts and headers."""
    for out in copies:
        if out.shm is not None and registry is not None:
            registry.write_output(out.shm, outputs[out.name], f"output '{out.name}'")
    return encode_infer_response_parts(model_name, VERSION, parsed, outputs, order)


def _answer_work(parsed: InferRequest, outputs: dict[str, Any], copies: Sequence[RequestedOutput],
                 order: Sequence[str]) -> int:
    """Bytes the answer copies or encodes (binary outputs are sent as views: no work)."""
    encoded = [out for out in requested_outputs(parsed, order) if out.shm is None and not out.binary]
    return sum(outputs[out.name].nbytes for out in [*encoded, *copies])


async def run_parsed(engine: Engine, model: LoadedModel, parsed: InferRequest, body: bytes | bytearray | memoryview,
                     shm: RegionsFor | None, reservation: Reservation) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Run a parsed infer request (HTTP or gRPC, `body` the bytes it was parsed from): its inputs and requested
    outputs checked against the model, the reservation grown to what the request holds at its peak plus its run
    inside onnxruntime (the attention scores), shared-memory outputs written in place where they can be. The
    outputs, and the views of the regions the run wrote (`copied_to_shm` names the outputs still to copy).
    The request's inputs are dropped: views of the body or of shared memory (a region unregistered meanwhile
    unmaps once unused)."""
    inputs = check_inputs(model, parsed.inputs)
    if parsed.outputs is not None:
        check_outputs(model, [out.name for out in parsed.outputs])
    needed = memory_needed(body, model, parsed, inputs) + engine.run_memory(model, inputs)
    await reservation.grow(needed, f"an inference on '{model.name}'")
    written = shm_destinations(model, parsed, inputs, shm)
    outputs = await engine.infer(model, inputs, written)
    parsed.inputs = []
    return outputs, written


async def _run_infer(request: Request, engine: Engine, model: LoadedModel, limit: int,
                     registry: SharedMemoryRegistry,
                     reservation: Reservation) -> tuple[list[bytes | bytearray | memoryview], dict[str, str]]:
    """One buffer for the body, numpy views of it (or of shared memory) into onnxruntime, and the answer
    sent as the JSON header plus views of the outputs. Only work that grows with the size (JSON parsing
    and encoding, copies into shared memory) goes to a worker thread."""
    header_length = request.headers.get(HEADER_LENGTH)
    json_length = _header_length(header_length)
    body = await read_aligned_body(request.headers.get("content-length"), request.stream(), limit,
                                   align_at=json_length, receive_into=receive_into_of(request.scope))
    phases.lap("read")
    shm = registry.for_caller(shared_memory_caller(request.scope)) if registry.enabled else None
    try:
        parsed = await parse_watched(request, json_length or len(body), parse_infer_request, body, header_length, shm)
        phases.lap("parse")
        outputs, written = await run_parsed(engine, model, parsed, body, shm, reservation)
        phases.lap("queue")
        del body  # the inputs were views of it, not needed any more
        order = model.config.output_names
        copies = copied_to_shm(parsed, outputs, written, order)
        answer = await maybe_offload(_answer_work(parsed, outputs, copies, order), _answer, model.name, shm,
                                     parsed, outputs, copies, order)
    finally:
        if shm is not None:
            shm.release()
    phases.lap("encode")
    return answer
