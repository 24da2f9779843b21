"""How a measurement is kept from flattering either side: dedicated cores, runtimes alone, and a control.

* Cores: with `--pin` (the default where at least 2 CPUs are usable) the usable CPUs are split in two sets:
  the servers and every anchor they are compared with run on the first (`Cores.serve`), the load generator
  and this process (the HTTP client) on the second (`Cores.load`). Servers and anchors get the same number
  of threads: one per CPU of the serve set (onnxruntime's intra-op threads, torch's threads). A process is
  placed by starting it inside `on_cores(...)`: a child inherits its parent's affinity, and so do the thread
  pools it creates later (setting another process's affinity from outside moves its main thread only).
* Alone: each in-process anchor (onnxruntime, torch eager) lives in its own process (`AnchorProcess`,
  multiprocessing spawn) and is timed in bursts, one side at a time, after a pause that lets the thread pool
  of whatever ran before it go idle (onnxruntime's spinning workers, OpenMP's); no two runtimes share a process.
* The control: two identical sides measured the same way must agree within `NOISE_LIMIT`; where they do not,
  the rows that depend on them say NOISY and `--check` fails with "too noisy to judge" instead of a
  PASS or BELOW the run cannot back.
* The rounds' own spread: a control is one draw of the noise, and lands near 1.0 by chance in a run whose rounds
  range over ±20 %. A ratio read from paired rounds (round i of each side measured back to back: `paired`)
  carries its standard error, and a row whose ratio lies within two of them of its target says NOISY too
  (`unresolved`): the run cannot tell on which side of the target it lies.
* `cpu_lines`: the CPU model, its vector ISA (AVX2, AVX-512, AMX, from /proc/cpuinfo's flags) and the thread
  counts, printed above every table.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from posenc.service.inference.runtime.calibration import Machine

NOISE_LIMIT = 0.03  # two identical sides may differ by this much before a run is too noisy to judge
TRIM = 0.2  # the share of a paired ratio's rounds left out at each end (`paired`)
RESOLUTION = NOISE_LIMIT / 2  # the standard error a load benchmark adds rounds for: a 3 % margin is two of them
SETTLE_S = 0.15  # the pause before each side: long enough for the previous side's thread pool to stop spinning


@dataclass(frozen=True)
class Cores:
    """Where the measured side (servers, anchors) and the load generator run, and the threads each side gets."""

    serve: frozenset[int]
    load: frozenset[int]
    pinned: bool

    @property
    def threads(self) -> int:
        """Threads of every server and anchor: one per CPU of the serve set."""
        return len(self.serve)

    def describe(self) -> str:
        if not self.pinned:
            return f"not pinned: everything shares CPUs {sorted(self.serve)}"
        return (f"pinned: servers and anchors on CPU {_cpus(self.serve)}, the load generator and the client on CPU "
                f"{_cpus(self.load)}")


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def plan_cores(pin: bool | None) -> Cores:
    """Split the usable CPUs in two halves (the serve set gets the odd one) when `pin` (None: when 2 or more)."""
    usable = sorted(os.sched_getaffinity(0))
    if pin is None:
        pin = len(usable) >= 2
    if not pin or len(usable) < 2:
        return Cores(frozenset(usable), frozenset(usable), False)
    half = (len(usable) + 1) // 2
    return Cores(frozenset(usable[:half]), frozenset(usable[half:]), True)


@contextmanager
def on_cores(cpus: frozenset[int]) -> Iterator[None]:
    """This thread on `cpus` for the block: what it starts inherits them."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


def cpu_model() -> str:
    """The CPU's model name (the service's calibration reads the same: `Machine.here`)."""
    return Machine.here().cpu or "unknown CPU"


def cpu_isa() -> list[str]:
    """The vector extensions the CPU reports (AVX2, AVX-512, AMX and their variants), from /proc/cpuinfo."""
    return Machine.here().isa_names()


def cpu_lines(cores: Cores, threads: int) -> list[str]:
    """`# ...` lines: the CPU, its ISA, where things run and the thread counts of both runtimes."""
    isa = ", ".join(cpu_isa()) or "none of AVX2/AVX-512/AMX"
    return [f"# CPU: {cpu_model()}; ISA: {isa}",
            f"# cores: {cores.describe()}; onnxruntime intra-op threads {threads} (servers and anchor), "
            f"torch threads {threads}"]


def cpu_summary(cores: Cores, threads: int) -> str:
    """One `# ...` line for above a table: the CPU, its ISA, the pinning and both runtimes' threads."""
    where = f"servers/anchors CPU {_cpus(cores.serve)}, load CPU {_cpus(cores.load)}" if cores.pinned else "not pinned"
    return (f"# on {cpu_model()} ({', '.join(cpu_isa()) or 'no AVX2/AVX-512/AMX'}); {where}; onnxruntime {threads} "
            f"intra-op thread(s), torch {threads} thread(s)")


def noisy(control: float | None) -> bool:
    """Whether a control ratio (two identical sides) is outside 1 ± NOISE_LIMIT."""
    return control is not None and abs(control - 1.0) > NOISE_LIMIT


@dataclass(frozen=True)
class Paired:
    """One side's value over another's, read from rounds measured back to back (round i of each side): `ratio`,
    the trimmed mean of the rounds' ratios on a log scale (a drift between rounds cancels in each round's ratio; a
    stalled round, a quarter of its side's rate, is among those trimmed), and `error`, the standard error of its
    log (None below 3 rounds: no spread to read)."""

    ratio: float
    error: float | None


def paired(mine: Sequence[float], theirs: Sequence[float]) -> Paired:
    """`Paired` from two sides' rounds (rates or times; rounds where either side read 0 are left out). The
    error is Tukey and McLaughlin's for a trimmed mean: the winsorized standard deviation over (1 - 2g/n)·√n."""
    logs = sorted(math.log(m / t) for m, t in zip(mine, theirs, strict=True) if m > 0 and t > 0)
    n = len(logs)
    if not n:
        return Paired(math.nan, None)
    cut = int(TRIM * n)  # rounds left out at each end
    ratio = math.exp(statistics.fmean(logs[cut:n - cut]))
    if n < 3:
        return Paired(ratio, None)
    low, high = logs[cut], logs[n - cut - 1]
    winsorized = [min(max(x, low), high) for x in logs]
    return Paired(ratio, statistics.stdev(winsorized) / ((1 - 2 * cut / n) * math.sqrt(n)))


def unresolved(ratio: float, target: float | None, error: float | None) -> bool:
    """Whether `ratio` lies within two standard errors (`error`, of its log) of `target`."""
    return target is not None and error is not None and ratio > 0 and abs(math.log(ratio / target)) < 2 * error


def burst_ms(fn: Callable[[], object], calls: int) -> list[float]:
    """Milliseconds of `calls` consecutive calls of `fn` after one untimed call."""
    fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return times


def alone(fn: Callable[[], list[float]],
          reduce: Callable[[list[float]], float] = statistics.median) -> Callable[[], float]:
    """A side of `interleaved`: wait for the machine's other runtimes to go idle, run `fn` (a burst), its median
    (or `reduce` of it)."""
    def side() -> float:
        time.sleep(SETTLE_S)
        return reduce(fn())
    return side


# --- anchors in their own processes -------------------------------------------------------------------------

def _anchor_main(conn: Any, threads: int) -> None:
    """The child: builds one callable at a time on request, times bursts of it, answers over `conn`."""
    calls: dict[str, Callable[[], Any]] = {}
    while True:
        message = conn.recv()
        verb = message[0]
        try:
            if verb == "quit":
                conn.send(("ok", None))
                return
            if verb == "load":
                _, key, builder, kwargs = message
                calls[key] = _BUILDERS[builder](threads=threads, **kwargs)
                conn.send(("ok", None))
            elif verb == "burst":
                conn.send(("ok", burst_ms(calls[message[2]], message[1])))
            elif verb == "output":
                conn.send(("ok", _as_numpy(calls[message[1]]())))
        except Exception as exc:  # the parent reports it with the side's name
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _as_numpy(result: Any) -> Any:
    import numpy as np

    if isinstance(result, list):
        result = result[0]
    if hasattr(result, "detach"):
        result = result.detach().cpu().numpy()
    return np.asarray(result)


def _ort_builder(threads: int, model: str, batch: int, seq: int, device: str = "cpu", binding: bool = False,
                 path: str | None = None, options: dict[str, str] | None = None,
                 level: str | None = None) -> Callable[[], Any]:
    """onnxruntime as a user runs it in-process: default session options but `threads` intra-op threads (and
    `options`/`level` where given), on `path` or the graph the server runs for the case."""
    from bench.harness import inputs
    from bench.inprocess import graph_path, io_binding_call, ort_call, ort_session, ort_session_at

    arrays = inputs(batch, seq, model)
    if device == "cuda":
        session = ort_session(model, device, seq)
        return io_binding_call(session, arrays) if binding else ort_call(session, arrays)
    return ort_call(ort_session_at(path or graph_path(model, device, seq), threads, options or {}, level), arrays)


def _torch_builder(threads: int, model: str, batch: int, seq: int, device: str = "cpu") -> Callable[[], Any]:
    from bench.harness import inputs
    from bench.inprocess import torch_call

    call = torch_call(model, inputs(batch, seq, model), device, threads)
    if call is None:
        raise RuntimeError("torch is not installed")
    return call


_BUILDERS: dict[str, Callable[..., Callable[[], Any]]] = {"ort": _ort_builder, "torch": _torch_builder}


class AnchorProcess:
    """One runtime in its own process on `cpus` with `threads` threads: `load` callables there (by key), time
    `burst`s of one (the child answers only between bursts, so nothing of it runs while other sides are
    measured)."""

    def __init__(self, name: str, cpus: frozenset[int], threads: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, child = context.Pipe()
        with on_cores(cpus):
            self.process = context.Process(target=_anchor_main, args=(child, threads), name=name, daemon=True)
            self.process.start()
        child.close()

    def _ask(self, *message: Any) -> Any:
        self.conn.send(message)
        status, answer = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.name}: {answer}")
        return answer

    def load(self, builder: str, key: str = "main", **kwargs: Any) -> None:
        self._ask("load", key, builder, kwargs)

    def burst(self, calls: int, key: str = "main") -> list[float]:
        result: list[float] = self._ask("burst", calls, key)
        return result

    def output(self, key: str = "main") -> Any:
        return self._ask("output", key)

    def close(self) -> None:
        if self.process.is_alive():
            with suppress(EOFError, OSError, RuntimeError):
                self._ask("quit")
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def __enter__(self) -> AnchorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
