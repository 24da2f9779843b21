"""The soak's gRPC traffic (scripts/soak.py): clients of the server's gRPC service beside the HTTP load, until SIGTERM.

* grpc-infer: unary ModelInfer, valid (200-like: OK) and invalid (a short raw input, an unknown model: the
  expected INVALID_ARGUMENT / NOT_FOUND);
* grpc-stream: streams of 8 requests, one of them for an unknown model (answered in its own `error_message`),
  every response read;
* grpc-abandoned: streams cancelled after their first response, or never read at all, then cancelled;
* grpc-idle-stream: a stream that sends nothing: it must end DEADLINE_EXCEEDED once POSENC_GRPC_STREAM_IDLE_SECONDS
  (`IDLE_SECONDS` in the soak) have passed, and not much later; or, once half of POSENC_MEMORY_WAIT_SECONDS has
  passed while other requests wait for memory, RESOURCE_EXHAUSTED naming that (the memory held for its next request
  goes to them);
* grpc-silent: ModelInfer calls that send their headers and never a message (issue 62), `SILENT_CALLS` at once, each
  given up by its client after `SILENT_SECONDS`: each must end RESOURCE_EXHAUSTED with a retry hint (the memory
  held for its message went to a request that waited, or none came free for it in time) or at its deadline; the
  HTTP and gRPC load beside them must not starve (the soak's other checks).

A violation: INTERNAL or UNKNOWN on any call, an unexpected status or response. RESOURCE_EXHAUSTED with a retry hint
(`retry-after`) is the overload HTTP answers 503 with Retry-After: allowed, counted apart. After the SIGTERM,
UNAVAILABLE (new calls refused) or CANCELLED (a call gRPC core had received but not yet handed to a handler when the
graceful stop began: grpc/grpc#41785) ends a client; calls in a handler finish within the graceful timeout.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import numpy as np

from posenc.service.grpc.servicer import RECLAIM_SECONDS, STREAM_RECLAIM_SHARE
from posenc.service.settings import Settings
from posenc.service.testing import attention_inputs

SERVICE = "/inference.GRPCInferenceService/"
KINDS = ("grpc-infer", "grpc-stream", "grpc-abandoned", "grpc-idle-stream", "grpc-silent")
EXPECTED = {"short": "INVALID_ARGUMENT", "unknown": "NOT_FOUND", "valid": "OK"}
CLIENTS = 4
IDLE_SECONDS = 10.0  # the soak server's POSENC_GRPC_STREAM_IDLE_SECONDS: above a busy client's pause between requests
IDLE_MARGIN_SECONDS = 15.0  # how much later than IDLE_SECONDS an idle stream may end (a loaded 2-core machine)
# how soon an idle stream may lose the memory held for its next request (the soak keeps POSENC_MEMORY_WAIT_SECONDS)
STREAM_RECLAIM_SECONDS = STREAM_RECLAIM_SHARE * (Settings().memory_wait_seconds or 0)
RECLAIMED = "while other requests waited for memory"  # in the status of a call that lost it
SILENT_CALLS = 2  # silent ModelInfer calls at once
SILENT_SECONDS = 15.0  # the deadline each is given: above RECLAIM_SECONDS and POSENC_MEMORY_WAIT_SECONDS
# the outcome recorded for a code: the soak counts an outcome without a status number as a lost response
HTTP_LIKE = {"OK": "200", "INVALID_ARGUMENT": "400 INVALID_ARGUMENT", "NOT_FOUND": "404 NOT_FOUND"}


def _request(model: str, seed: int, short: bool = False) -> bytes:
    """A small request (B ≤ 2, S ≤ 64): built once, before the load, as the soak's HTTP bodies are; the
    soak's one event loop also runs the HTTP clients, which must not wait on this."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model, id=str(seed))
    for name, array in attention_inputs(8, 8, 64, 1 + seed % 2, 16 * (1 + seed % 4), start=seed).items():
        request.inputs.add(name=name, datatype="FP32" if array.dtype == np.float32 else "INT64", shape=array.shape)
        request.raw_input_contents.append(array.tobytes())
    if short:
        request.raw_input_contents[0] = request.raw_input_contents[0][:-4]
    return request.SerializeToString()


async def grpc_load(soak: Any) -> None:
    """Every gRPC client of the soak, until the server is gone (`soak`: scripts/soak.py's Soak)."""
    import grpc

    bodies = {"valid": [_request("rope_attention", seed) for seed in range(8)],
              "short": [_request("rope_attention", 1, short=True)], "unknown": [_request("no_such_model", 2)]}
    stream_requests = [_request("no_such_model" if i == 3 else "rope_attention", i) for i in range(8)]
    async with grpc.aio.insecure_channel(soak.server.grpc_address) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer")
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
        await asyncio.gather(*(_unary(soak, infer, i, bodies) for i in range(CLIENTS)),
                             _streams(soak, stream, stream_requests), _abandoned(soak, stream, bodies["valid"]),
                             _idle(soak), *(_silent(soak, i) for i in range(SILENT_CALLS)))


def _running(soak: Any) -> bool:
    return soak.server.poll() is None


def _code(exc: Any) -> str:
    """The status code's name of a failed call; RESOURCE_EXHAUSTED with a retry hint (the overload HTTP answers 503
    with Retry-After) as OVERLOADED."""
    code = exc.code().name
    if code == "RESOURCE_EXHAUSTED" and any(key == "retry-after" for key, _ in exc.trailing_metadata() or ()):
        return OVERLOADED
    return str(code)


OVERLOADED = "RESOURCE_EXHAUSTED+retry-after"


def _outcome(soak: Any, kind: str, code: str, expected: str, start: float, sent: float, details: str = "") -> bool:
    """Record a call (`details`: its status message); False once the server refuses calls after the SIGTERM (the
    client stops)."""
    if code == OVERLOADED:  # allowed, counted apart as over HTTP
        soak.record(kind, "503+Retry-After", start, sent)
        return True
    if code in ("UNAVAILABLE", "CANCELLED") and soak.sigterm_at is not None:
        # refused at shutdown: UNAVAILABLE for a new call; CANCELLED for one the server had received but not yet
        # handed to a handler when its graceful stop began (gRPC core cancels those: grpc/grpc#41785). Calls
        # in a handler are answered (a stream's too).
        soak.record(kind, f"{code} at shutdown", start, None)
        return False
    violation = None if code == expected else f"{code}, expected {expected}{_when(soak, start, details)}"
    soak.record(kind, HTTP_LIKE.get(code, code), start, sent, violation)
    return True


def _when(soak: Any, start: float, details: str) -> str:
    """When a call that went wrong began and ended, against the SIGTERM, and what its status said."""
    now, sigterm = time.monotonic(), soak.sigterm_at
    when = (f" (began {start - sigterm:+.1f} s, ended {now - sigterm:+.1f} s from the SIGTERM)" if sigterm is not None
            else f" (after {now - start:.1f} s, before the SIGTERM)")
    return when + (f": {details[:300]}" if details else "")


async def _unary(soak: Any, infer: Any, index: int, bodies: dict[str, list[bytes]]) -> None:
    import grpc

    rng = random.Random(soak.args.seed * 31 + index)
    while _running(soak):
        case = rng.choices(list(EXPECTED), [1, 1, 6])[0]
        data = rng.choice(bodies[case])
        start = sent = time.monotonic()
        details = ""
        try:
            await infer(data, timeout=60)
            code = "OK"
        except grpc.aio.AioRpcError as exc:
            code, details = _code(exc), exc.details() or ""
        if not _outcome(soak, "grpc-infer", code, EXPECTED[case], start, sent, details):
            return


async def _streams(soak: Any, stream: Any, requests: list[bytes]) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    while _running(soak):
        start = sent = time.monotonic()
        details = ""
        try:
            answers = [pb.ModelStreamInferResponse.FromString(a) async for a in stream(iter(requests), timeout=60)]
            errors = [bool(a.error_message) for a in answers]
            code = "OK" if errors == [i == 3 for i in range(8)] else f"{len(answers)} answers, errors at {errors}"
        except grpc.aio.AioRpcError as exc:
            code, details = _code(exc), exc.details() or ""
        if not _outcome(soak, "grpc-stream", code, "OK", start, sent, details):
            return


async def _abandoned(soak: Any, stream: Any, valid: list[bytes]) -> None:
    import grpc

    seed = soak.args.seed * 13
    while _running(soak) and soak.sigterm_at is None:
        seed += 1
        start = time.monotonic()
        call = stream(iter(valid * 5), timeout=60)
        try:
            if seed % 2:
                await call.read()  # one answer, then gone
            else:
                await asyncio.sleep(0.05)  # never read
        except grpc.aio.AioRpcError as exc:
            if soak.sigterm_at is None:
                soak.record("grpc-abandoned", exc.code().name, start, None, f"{exc.code().name} before cancelling")
            return
        call.cancel()
        soak.record("grpc-abandoned", "200", start, None)
        await asyncio.sleep(0.2)


async def _nothing() -> Any:
    """A stream's requests: none, ever (until the call ends)."""
    await asyncio.Event().wait()
    yield b""


async def _idle(soak: Any) -> None:
    """Streams that send nothing (a client of its own): ended DEADLINE_EXCEEDED after the idle time, not before nor
    much later."""
    import grpc

    async with grpc.aio.insecure_channel(soak.server.grpc_address) as channel:
        stream = channel.stream_stream(SERVICE + "ModelStreamInfer")
        while _running(soak) and soak.sigterm_at is None:
            if not await _idle_once(soak, stream):
                return


async def _idle_once(soak: Any, stream: Any) -> bool:
    """One idle stream; False once the server is stopping."""
    import grpc

    start = time.monotonic()
    call = stream(_nothing(), timeout=60)
    reclaimed = False
    try:
        async for _ in call:
            pass
        code = "OK"
    except grpc.aio.AioRpcError as exc:
        code = exc.code().name
        reclaimed = code == "RESOURCE_EXHAUSTED" and RECLAIMED in (exc.details() or "")
    took = time.monotonic() - start
    if soak.sigterm_at is not None:  # refused or cut at shutdown: `_outcome` knows which codes may end it
        if code == "DEADLINE_EXCEEDED" or reclaimed:
            soak.record("grpc-idle-stream", "200", start, None)
        else:
            _outcome(soak, "grpc-idle-stream", code, "DEADLINE_EXCEEDED", start, start)
        return False
    # ended as idle, or earlier for memory that others waited for (not before its time)
    earliest = STREAM_RECLAIM_SECONDS if reclaimed else IDLE_SECONDS
    if code not in ("DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED") or (code == "RESOURCE_EXHAUSTED") != reclaimed or \
            not earliest <= took <= IDLE_SECONDS + IDLE_MARGIN_SECONDS:
        expected = (f"DEADLINE_EXCEEDED after {IDLE_SECONDS:g}-{IDLE_SECONDS + IDLE_MARGIN_SECONDS:g} s, or "
                    f"RESOURCE_EXHAUSTED ({RECLAIMED}) after {STREAM_RECLAIM_SECONDS:g} s at least")
        _outcome(soak, "grpc-idle-stream", f"{code} after {took:.1f} s", expected, start, start)
        return True
    soak.record("grpc-idle-stream", "200", start, None)
    return True


async def _silent(soak: Any, index: int) -> None:
    """ModelInfer calls that send their headers and no message, one after the other on a connection of their own,
    each given up after SILENT_SECONDS, until the SIGTERM: each must end RESOURCE_EXHAUSTED with a retry hint (its
    memory taken back for a waiting request after RECLAIM_SECONDS at least, or none free in time), or at its
    deadline; never OK, never INTERNAL."""
    import grpc

    options = [("posenc.soak.silent", index)]  # a connection of its own
    async with grpc.aio.insecure_channel(soak.server.grpc_address, options=options) as channel:
        infer = channel.stream_unary(SERVICE + "ModelInfer")
        while _running(soak) and soak.sigterm_at is None:
            start = time.monotonic()
            try:
                await infer(timeout=SILENT_SECONDS)  # no request iterator: the call writes nothing, ever
                code = "OK"
            except grpc.aio.AioRpcError as exc:
                code = _code(exc)
                if code == OVERLOADED and RECLAIMED in (exc.details() or "") and \
                        time.monotonic() - start < RECLAIM_SECONDS:
                    code = f"memory taken back after {time.monotonic() - start:.1f} s"
            if code in (OVERLOADED, "DEADLINE_EXCEEDED"):
                soak.record("grpc-silent", "200", start, None)
            elif not _outcome(soak, "grpc-silent", code, f"{OVERLOADED} or DEADLINE_EXCEEDED", start, start):
                return  # refused at shutdown
