"""servers: the same posenc app on different ASGI servers, measured side by side in one run.

    python -m bench servers                        # about 4 minutes on 2 cores
    python -m bench servers --rounds 3 --seconds 2

Servers (default settings, POSENC_* unset; each on a free loopback port; every one with posenc's log
configuration, so each writes the same access log to its log file):
  posenc serve      uvicorn + uvloop + httptools with posenc's head/body/keep-alive timers (the default)
  uvicorn httptools stock uvicorn + uvloop + httptools (no posenc timers: their cost)
  uvicorn h11       stock uvicorn + uvloop + h11 (the pure-Python HTTP parser)
  2 workers         `posenc serve` with POSENC_WORKERS=2 (uvicorn's supervisor, SO_REUSEPORT-free shared socket)
  granian           granian (Rust HTTP, ASGI interface, uvloop), if `import granian` works (pip install granian)

Workloads: the cached small table and /healthz (req/s, 16 connections), the cached 64 MiB table (GB/s, 16
connections), 16 clients of single-row binary infer at S=64 (req/s), one client of B=8 S=512 binary infer
(25 MB in, 8 MB out; median ms). Rounds are interleaved across servers; a value is the median of its rounds;
the ratio column divides by `posenc serve` (higher is better for the server in that column).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.harness import CLIENTS, LARGE, SMALL, Bench, Report, Servers, Target, infer_target, inputs, interleaved, log
from posenc.service.testing import LoadResult, ServerProcess

APP = "posenc.service.serving.process:app_from_env"


@dataclass(frozen=True)
class Workload:
    name: str
    unit: str
    connections: int
    target: Target
    value: Callable[[LoadResult], float]
    higher_is_better: bool = True
    min_seconds: int = 1  # rounds at least this long: enough whole responses of the slow workloads


def log_config_file(work_dir: Path) -> Path:
    """posenc's own logging configuration (what `posenc serve` hands uvicorn) as a JSON file for other servers."""
    from posenc.service.http.logs import log_config
    from posenc.service.settings import Settings

    path = work_dir / "log-config.json"
    path.write_text(json.dumps(log_config(Settings())))
    return path


def start_servers(servers: Servers, work_dir: Path, notes: list[str]) -> None:
    log_config = str(log_config_file(work_dir))
    servers.start("posenc serve")
    for http in ("httptools", "h11"):
        servers.start(f"uvicorn {http}", command=[
            sys.executable, "-m", "uvicorn", APP, "--factory", "--host", "{host}", "--port", "{port}", "--loop",
            "uvloop", "--http", http, "--no-access-log", "--log-config", log_config])
    servers.start("2 workers", {"workers": 2})
    try:
        import granian  # noqa: F401
    except ImportError:
        notes.append("# granian: not installed (pip install granian to include it)")
        return
    servers.start("granian", command=[
        sys.executable, "-m", "granian", "--interface", "asgi", "--factory", "--host", "{host}", "--port", "{port}",
        "--loop", "uvloop", "--http", "1", "--no-ws", "--workers", "1", "--no-access-log", "--log-config", log_config,
        APP])


def workloads(work_dir: Path) -> list[Workload]:
    return [
        Workload("cached small table", "req/s", CLIENTS, Target(SMALL), lambda r: r.rps),
        Workload("/healthz", "req/s", CLIENTS, Target("/healthz"), lambda r: r.rps),
        Workload("cached 64 MiB table", "GB/s", CLIENTS, Target(LARGE), lambda r: r.gbps, min_seconds=4),
        Workload("infer 16 clients B=1 S=64", "req/s", CLIENTS, infer_target(inputs(1, 64), work_dir),
                 lambda r: r.rps),
        Workload("infer 1 client B=8 S=512", "ms", 1, infer_target(inputs(8, 512), work_dir), lambda r: r.p50_ms,
                 higher_is_better=False, min_seconds=3),
    ]


def measure(bench: Bench, servers: list[ServerProcess], workload: Workload, rounds: int) -> list[float]:
    """Median value per server over interleaved rounds (rounds with errors count as 0 / inf)."""
    load, seconds = bench.load, max(bench.args.seconds, workload.min_seconds)

    def side(server: ServerProcess) -> Callable[[], float]:
        load.round(server.port, workload.target, 1, workload.connections)  # warm-up: fills every worker's caches

        def one() -> float:
            result = load.round(server.port, workload.target, seconds, workload.connections)
            if result.errors or not result.requests:
                print(f"# {server.name}: {result.errors} errors of {result.requests} requests ({workload.name})",
                      flush=True)
                return 0.0 if workload.higher_is_better else float("inf")
            return workload.value(result)
        return one

    return [statistics.median(values) for values in interleaved(rounds, *(side(server) for server in servers))]


def table(servers: list[ServerProcess], results: list[tuple[Workload, list[float]]]) -> str:
    header = ["workload", "unit", *(s.name for s in servers)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for workload, values in results:
        base = values[0]
        cells = []
        for value in values:
            ratio = (value / base if workload.higher_is_better else base / value) if base and value else 0.0
            cells.append(f"{value:,.3g} ({ratio:.2f}x)")
        lines.append("| " + " | ".join([workload.name, workload.unit, *cells]) + " |")
    return "\n".join(lines)


def run(bench: Bench) -> Report:
    rounds = bench.args.rounds or 3
    report = Report(notes=[f"# servers: {rounds} x {bench.args.seconds} s rounds, interleaved across servers"])
    with bench.servers() as servers:
        start_servers(servers, bench.work_dir, report.notes)
        servers.ready("/readyz")
        results = []
        for workload in workloads(bench.work_dir):
            results.append((workload, measure(bench, servers.started, workload, rounds)))
            log(f"{workload.name} done")
        report.tables.append(table(servers.started, results))
    return report
