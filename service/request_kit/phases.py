"""Where one inference's time went on the server, phase by phase: measured for every inference (a few clock reads),
counted in the process's metrics per model, protocol and phase (`posenc_inference_phase_duration_us`, Triton's
`nv_inference_*_duration_us` counters' kind), and sent as the `Server-Timing` header of an HTTP answer and the
`server-timing` trailing metadata of a gRPC one when POSENC_SERVER_TIMING is on.

Phases, in milliseconds of wall-clock time (W3C Server Timing syntax, `name;dur=ms`):

    route   HTTP: from the request's head parsed to the handler's start: the event loop's backlog, routing,
            middleware and dependencies (`HEAD_AT`, stamped by posenc's server; under another, the app's first look)
    admit   the admission step before a byte is read: readiness, the model's queue and the memory budget (waiting
            for memory included)
    read    the body (HTTP) or the message (gRPC), to its last byte (the client's upload included)
    parse   the JSON header or the protobuf, into views of the inputs
    queue   from the parsed request to its run and back: the checks against the model, the memory reservation,
            the batcher (a free slot, a batch, the hand-off to a worker thread)
    run     onnxruntime's run (for a batch, the batch's run, which its requests share)
    encode  the outputs into the answer (the copies into shared memory included)
    total   from the request's head parsed (HTTP; gRPC: the handler's start) to the answer made; what follows
            (sending it) is the client's to measure

The request's `Phases` travels in a context variable (`started` sets it): the handlers' laps and the batcher's
run, a few calls below them, reach it without a parameter through every layer.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

HEADER = "Server-Timing"
TRAILER = "server-timing"  # gRPC metadata keys are lower case
HEAD_AT = "posenc.head_at"  # ASGI scope key: time.perf_counter() when the request's head was parsed

ORDER = ("route", "admit", "read", "parse", "queue", "run", "encode")
CURRENT: ContextVar[Phases | None] = ContextVar("posenc_phases", default=None)


class Phases:
    """Durations by phase of one request, from consecutive laps; spans measured inside a lap (`add`) are
    taken out of it."""

    __slots__ = ("inner", "mark", "spans", "started")

    def __init__(self, since: float | None = None) -> None:
        self.started = self.mark = time.perf_counter() if since is None else since
        self.inner = 0.0  # seconds `add`ed since the last lap
        self.spans: dict[str, float] = {}

    def lap(self, name: str) -> None:
        """The time since the previous lap (or the start) is `name`'s, less what `add` recorded meanwhile."""
        now = time.perf_counter()
        self.spans[name] = self.spans.get(name, 0.0) + max(0.0, now - self.mark - self.inner)
        self.mark, self.inner = now, 0.0

    def add(self, name: str, seconds: float) -> None:
        self.spans[name] = self.spans.get(name, 0.0) + seconds
        self.inner += seconds

    def total(self) -> float:
        """Seconds since the start."""
        return time.perf_counter() - self.started

    def value(self) -> str:
        """`route;dur=0.08, admit;dur=0.012, ..., total;dur=0.9`: the phases in the order of ORDER."""
        total = self.total()
        spans = sorted(self.spans.items(), key=lambda span: ORDER.index(span[0]) if span[0] in ORDER else len(ORDER))
        return ", ".join(f"{name};dur={seconds * 1e3:.3f}" for name, seconds in [*spans, ("total", total)])


def started(since: float | None = None) -> Phases:
    """A new `Phases` counting from `since` (a `time.perf_counter()`; default now), current for this task."""
    phases = Phases(since)
    CURRENT.set(phases)
    return phases


def current() -> Phases | None:
    """The current request's phases (None: not an inference)."""
    return CURRENT.get()


def lap(name: str) -> None:
    """A lap of the current request (nothing when the request is not timed)."""
    phases = CURRENT.get()
    if phases is not None:
        phases.lap(name)


def add_run(seconds: float) -> None:
    """The batcher's measure of the current request's run (nothing when the request is not timed)."""
    phases = CURRENT.get()
    if phases is not None:
        phases.add("run", seconds)


def parse(value: str) -> dict[str, float]:
    """A `Server-Timing` value back into milliseconds by name (the bench's and the tests' reader)."""
    spans = {}
    for entry in value.split(","):
        name, _, params = entry.strip().partition(";")
        for param in params.split(";"):
            key, _, number = param.strip().partition("=")
            if key == "dur":
                spans[name] = float(number)
    return spans
