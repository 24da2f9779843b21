"""What every sub-benchmark shares: servers on loopback, the load, side-by-side measurement, the ratio table.

* `Servers`: the servers of one sub-benchmark (the test kit's ServerProcess: posenc with POSENC_* settings
  and no POSENC_* of this shell, or another server command), each log in the work folder, all stopped
  together at the end (SIGTERM to each, then SIGKILL after a bound).
* `Load.round`: one fixed-duration round of N keep-alive connections sending one request as fast as they
  can (closed loop): `wrk -t1` when installed, else the test kit's LoadGenerator. Both read every body in
  full and count non-2xx answers and socket errors.
* `interleaved`: rounds of every side, the order reversed every other round, so that drift and noise hit
  all sides alike; a side's value is the median of its rounds. In the load benchmarks (batching, tables) a ratio
  is read from the paired rounds instead (`paired`: the trimmed mean of round i's ratios, with a standard
  error), and `interleaved_until` adds rounds until it is precise enough.
* `Row` / `format_table`: one line per ratio (posenc value, anchor value, ratio ± its standard error, target,
  PASS/BELOW, or NOISY where the run's control, two identical sides measured the same way, differs by more than
  3 %, or where the ratio lies within two standard errors of its target).
Cores, anchors in their own processes and the control: bench/isolation.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bench.isolation import Cores, Paired, cpu_lines, noisy, on_cores, unresolved
from posenc.models.graph_rule import STANDARD_FILE, cpu_forms_of, describe
from posenc.service.testing import (
    HttpRequest,
    LoadGenerator,
    LoadResult,
    ServerProcess,
    attention_inputs,
    http_request,
    kserve_request,
    without_posenc,
)
from posenc.service.testing.server import kill_group

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
CLIENTS = 16  # connections of the req/s rows
SMALL = "/v1/alibi/slopes?num_heads=32"
LARGE = "/v1/rope?max_position=65536&head_dim=128&format=safetensors"
MODEL = "rope_attention"

# wrk script: request from BENCH_* variables; `done` prints one machine-readable summary line.
WRK_SCRIPT = r'''
local method = os.getenv("BENCH_METHOD")
if method and method ~= "" then wrk.method = method end
local body = os.getenv("BENCH_BODY")
if body and body ~= "" then
  local f = assert(io.open(body, "rb")); wrk.body = f:read("*a"); f:close()
end
for name, value in (os.getenv("BENCH_HEADERS") or ""):gmatch("([^:\n]+):%s*([^\n]*)") do
  wrk.headers[name] = value
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH_RESULT %d %d %d %d %d %d %d %d %.1f\n", summary.duration, summary.requests,
    summary.bytes, e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50)))
end
'''


def log(message: str) -> None:
    print(f".. {message}", file=sys.stderr, flush=True)


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def interleaved(rounds: int, *sides: Callable[[], T], first: int = 0) -> list[list[T]]:
    """`rounds` rounds of every side, the order reversed every other round (AB, BA, AB, ...; `first`: the index
    of the first round, for rounds that go on from earlier ones); one list of results per side."""
    results: list[list[T]] = [[] for _ in sides]
    for i in range(first, first + rounds):
        order = list(enumerate(sides))
        for k, side in order if i % 2 == 0 else order[::-1]:
            results[k].append(side())
    return results


def interleaved_until(settled: Callable[[list[list[T]]], bool], rounds: int, most: int, step: int,
                      *sides: Callable[[], T]) -> list[list[T]]:
    """`interleaved(rounds, ...)`, then `step` rounds more at a time until `settled(results)` or `most` rounds.
    Whether to go on must not depend on where the ratios lie (only on how precise they are), or stopping would
    favour a verdict."""
    results = interleaved(rounds, *sides)
    while len(results[0]) < most and not settled(results):
        more = interleaved(min(step, most - len(results[0])), *sides, first=len(results[0]))
        for side, extra in zip(results, more, strict=True):
            side.extend(extra)
    return results


REPLICAS = 3  # server processes per side of a load benchmark (not --quick): what one process gains or loses
ROUNDS_PER_REPLICA = 3  # the default rounds of such a benchmark, per server process of a side


def replicas_of(args: Any) -> int:
    """Server processes per side: --replicas, else REPLICAS (1 with --quick)."""
    return int(getattr(args, "replicas", None) or (1 if getattr(args, "quick", False) else REPLICAS))


def load_rounds(args: Any) -> int:
    """Rounds per side of a benchmark whose sides are server processes taking them in turn: --rounds, else
    ROUNDS_PER_REPLICA per process."""
    return int(args.rounds or ROUNDS_PER_REPLICA * replicas_of(args))


def in_turn(side: Sequence[ServerProcess], round_on: Callable[[int], T]) -> Callable[[], T]:
    """A side of `interleaved` made of several server processes that take its rounds in turn (`round_on` a
    server's port): two processes of one server differ by more than one process's rounds do (its placement in
    memory and caches), so each side's rounds are spread over several, as they are over the machine's noise."""
    turns = itertools.cycle(side)
    return lambda: round_on(next(turns).port)


def spread(mine: Sequence[float], theirs: Sequence[float], higher_is_better: bool = True) -> str:
    """The range of the per-round ratios (round i of posenc against round i of the anchor): the noise."""
    ratios = [m / t if higher_is_better else t / m for m, t in zip(mine, theirs, strict=True) if m and t]
    return f"rounds {min(ratios):.2f}-{max(ratios):.2f}" if ratios else "no rounds"


def timed_ms(fn: Callable[[], object], seconds: float, min_calls: int = 3) -> float:
    """Median milliseconds per call of `fn`, called repeatedly for `seconds` (at least `min_calls` times)."""
    times: list[float] = []
    end = time.perf_counter() + seconds
    while len(times) < min_calls or time.perf_counter() < end:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def call_ms(fn: Callable[[], object]) -> Callable[[], float]:
    """A side of `interleaved` that times one call of `fn` (milliseconds)."""
    def side() -> float:
        start = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - start)
    return side


REPOSITORY_ENV = "POSENC_BENCH_REPOSITORY"  # the calibrated copy of onnx/ (`calibrated_repository`), for children too


def repository() -> Path:
    """The model repository every server, anchor and peer of this run reads: the shipped models, with the rule
    calibrated on this run's server CPUs (`calibrated_repository`), else onnx/ itself."""
    return Path(os.environ.get(REPOSITORY_ENV) or ROOT / "onnx")


def calibrated_repository(work_dir: Path, cores: Cores, threads: int) -> Path:
    """A copy of onnx/ whose config.json files hold the CPU-graph rule `posenc calibrate --write` measures on the
    servers' CPUs with `threads` intra-op threads (what a server's start-up calibration would choose there). Named in
    REPOSITORY_ENV for this process and its children (`python -m bench` does, for its run), the servers
    (POSENC_CPU_FORM_FROM=config), the in-process anchors and the KServe peer run the same graph for each case."""
    target = work_dir / "onnx"
    shutil.copytree(ROOT / "onnx", target)
    env = {**without_posenc(), "POSENC_INTRA_OP_NUM_THREADS": str(threads)}
    with on_cores(cores.serve):
        done = subprocess.run([sys.executable, "-m", "posenc.service.cli", "calibrate", "--write", "--repository",
                               str(target)], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"posenc calibrate failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return target


def rule_summary(folder: Path) -> str:
    """One line per model: the CPU graph each sequence length runs on (config.json's `cpu_rule`)."""
    rules = {path.parent.name: cpu_forms_of(json.loads(path.read_text()))[1] or [(1, STANDARD_FILE)]
             for path in sorted(folder.glob("*/config.json"))}
    lines = [f"#   {model}: {describe(rule)}" for model, rule in rules.items()]
    return "\n".join(["# CPU graphs, calibrated on the servers' CPUs (posenc calibrate), from sequence length:",
                      *lines])


def model_config(model: str = MODEL) -> dict[str, Any]:
    """<repository>/<model>/config.json of a shipped model."""
    config: dict[str, Any] = json.loads((repository() / model / "config.json").read_text())
    return config


def inputs(batch: int, seq: int, model: str = MODEL, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of a shipped model: query [B, Hq, S, D], key/value [B, Hkv, S, D] float32, position_ids [B, S] int64
    (rope_attention: Hq = Hkv = 8, D = 64; llama3_1_attention: 32, 8, 128)."""
    attention = model_config(model)["attention"]
    return attention_inputs(attention["num_heads"], attention["num_kv_heads"], attention["head_dim"], batch, seq,
                            seed=seed)


@dataclass
class Target:
    """What a load round sends: one request, repeated (`body_file`: the body on disk, for wrk)."""

    path: str
    method: str = "GET"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    body_file: Path | None = None


def infer_target(arrays: dict[str, np.ndarray], work_dir: Path, model: str = MODEL) -> Target:
    """A binary-tensor KServe v2 request (binary output requested), its body also written for wrk."""
    request = kserve_request(arrays, binary_output=True, content_type=True)
    body_file = work_dir / f"infer-{model}-{'x'.join(map(str, arrays['query'].shape))}.bin"
    body_file.write_bytes(request.body)
    return Target(f"/v2/models/{model}/infer", "POST", request.body, request.headers, body_file)


def model_stats(port: int, model: str = MODEL) -> tuple[int, int]:
    """(inference_count, execution_count) of a model: rows served and onnxruntime runs."""
    stats = json.loads(http_request(port, f"/v2/models/{model}/stats")[2])["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


class Load:
    """Fixed-duration closed-loop rounds: `wrk -t1 -cN` if available (and not disabled), else the test kit's
    LoadGenerator."""

    def __init__(self, work_dir: Path, prefer_wrk: bool = True) -> None:
        self.wrk = shutil.which("wrk") if prefer_wrk else None
        self.script = work_dir / "bench.lua"
        self.script.write_text(WRK_SCRIPT)

    def describe(self) -> str:
        if not self.wrk:
            return "the test kit's LoadGenerator (asyncio HTTP/1.1 keep-alive; wrk not found, or --no-wrk)"
        version = subprocess.run([self.wrk, "-v"], capture_output=True, text=True).stdout.split("\n")[0]
        return f"{version.split(' [')[0]} (-t1)"

    def round(self, port: int, target: Target, seconds: float, connections: int) -> LoadResult:
        if self.wrk:
            return self._wrk(port, target, seconds, connections)
        request = HttpRequest(target.method, target.path, target.body, target.headers)
        return LoadGenerator(port, connections=connections, seconds=seconds).run(request)

    def _wrk(self, port: int, target: Target, seconds: float, connections: int) -> LoadResult:
        env = {**os.environ, "BENCH_METHOD": target.method,
               "BENCH_BODY": str(target.body_file) if target.body_file else "",
               "BENCH_HEADERS": "\n".join(f"{k}: {v}" for k, v in target.headers.items())}
        argv = [str(self.wrk), "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "60s",
                "-s", str(self.script), f"http://127.0.0.1:{port}{target.path}"]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
        line = next((x for x in out.stdout.splitlines() if x.startswith("BENCH_RESULT")), None)
        if line is None:
            raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-800:]} {out.stderr[-800:]}")
        us, requests, nbytes, *errors, p50_us = line.split()[1:]
        failed = sum(int(e) for e in errors)
        return LoadResult(int(requests), int(nbytes), failed, int(us) / 1e6, float(p50_us) / 1000, Counter(),
                          failed - int(errors[3]))


class Servers:
    """The servers of one sub-benchmark, logs in `work_dir`; a context manager that stops them all."""

    def __init__(self, work_dir: Path, cores: Cores) -> None:
        self.work_dir = work_dir
        self.cores = cores
        self.started: list[ServerProcess] = []

    def start(self, name: str, settings: dict[str, object] | None = None, *, command: Sequence[str] | None = None,
              env: dict[str, str] | None = None) -> ServerProcess:
        """`posenc serve` (or `command`, whose parts may hold {host} and {port}) with `settings` as POSENC_*
        and none of this shell's, on the serve CPUs; started at once, not waited for (see `ready`)."""
        log_path = self.work_dir / f"{re.sub(r'[^a-z0-9]+', '-', name.lower())}.log"
        # every server runs the graph the rule of this run's calibrated repository names, as the anchors and the
        # KServe peer do (bench/inprocess.py model_file)
        settings = {"cpu_form_from": "config", "model_repository": str(repository()), **(settings or {})}
        server = ServerProcess(settings, command=command, env=env, base_env=without_posenc(), cwd=ROOT,
                               ready=None, log_path=log_path, name=name)
        with on_cores(self.cores.serve):
            self.started.append(server.start())
        return server

    def ready(self, path: str = "/readyz", timeout: float = 90) -> None:
        for server in self.started:
            server.wait_ready(path, timeout)

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc: object) -> None:
        previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:  # a second Ctrl-C must not leave servers behind
            for server in self.started:
                server.terminate()
            for server in self.started:
                server.stop()
            for server in self.started:  # what a server left of its process group (LitServe's API server, worker)
                kill_group(server.pid)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@dataclass
class Bench:
    """One run of the entry point: its work folder, its load, its options."""

    work_dir: Path
    load: Load
    args: argparse.Namespace
    cores: Cores

    def servers(self) -> Servers:
        return Servers(self.work_dir, self.cores)


def machine_header(cores: Cores, threads: int) -> list[str]:
    """CPU model, cores, load average and the Python / library versions, as `# ...` lines."""
    import fastapi
    import onnxruntime
    import uvicorn

    usable = len(cores.serve | cores.load)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    try:
        import torch
        torch_version = f", torch {torch.__version__}"
    except ImportError:
        torch_version = ""
    return [f"# machine: {os.cpu_count()} CPUs ({usable} usable by this process), load average {load}",
            *cpu_lines(cores, threads),
            f"# Python {sys.version.split()[0]}, uvicorn {uvicorn.__version__}, fastapi {fastapi.__version__}, "
            f"onnxruntime {onnxruntime.__version__}, numpy {np.__version__}{torch_version}"]


@dataclass
class Row:
    """One ratio. `ratio` is oriented so that higher is better for posenc (posenc/anchor for rates,
    anchor/posenc for times) unless `at_most` (then the target is a ceiling: a ratio of costs);
    `target` None means informational (no PASS/BELOW). `control`: the ratio of two identical sides measured
    the same way in the same run (1.0 on a quiet machine); outside 1 ± 3 % a row with a target says NOISY.
    `paired`: the ratio read from paired rounds with its standard error (`bench.isolation.paired`, posenc over
    anchor), where it replaces value / anchor (the columns then show each side's median); a ratio within two
    standard errors of its target says NOISY as well."""

    what: str
    value: float
    anchor: float
    unit: str
    higher_is_better: bool
    target: float | None = None
    note: str = ""
    errors: int = 0
    at_most: bool = False
    control: float | None = None
    paired: Paired | None = None

    @property
    def ratio(self) -> float:
        if self.paired is not None:
            return self.paired.ratio if self.higher_is_better else 1 / self.paired.ratio
        if not self.value or not self.anchor:
            return float("nan")
        return self.value / self.anchor if self.higher_is_better else self.anchor / self.value

    @property
    def error(self) -> float | None:
        return None if self.paired is None else self.paired.error

    @property
    def status(self) -> str:
        if self.errors:
            return "ERROR"
        if self.target is None:
            return "info"
        if noisy(self.control) or unresolved(self.ratio, self.target, self.error):
            return "NOISY"
        passed = self.ratio <= self.target if self.at_most else self.ratio >= self.target
        return "PASS" if passed else "BELOW"


@dataclass
class Report:
    """What a sub-benchmark found: rows of the ratio table, tables of its own, `# ...` notes."""

    rows: list[Row] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def format_table(rows: list[Row]) -> str:
    """A fixed-width table; a failing row says BELOW (or ERROR when any request failed)."""
    head = ["what", "posenc", "anchor", "ratio", "target", "control", "status", "note"]
    def cell(x: float, unit: str) -> str:
        return "-" if x != x else f"{_num(x)} {unit}"  # nan: a row of a side that was not measured

    body = [[r.what, cell(r.value, r.unit), cell(r.anchor, r.unit),
             "-" if r.ratio != r.ratio else f"{r.ratio:.3f}" + ("" if r.error is None else f" ±{r.error:.1%}"),
             "-" if r.target is None else f"{'<=' if r.at_most else '>='} {r.target:.2f}",
             "-" if r.control is None else f"{r.control:.3f}", r.status, r.note]
            for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
