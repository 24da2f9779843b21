"""The same posenc app on different ASGI servers, measured side by side in one run.

    python bench/servers.py                       # about 4 minutes on 2 cores
    python bench/servers.py --rounds 3 --seconds 2

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

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, LoadGen, LoadResult, Service, Target, free_port, machine_header, posenc_service, stop_all
from ratios import LARGE, SMALL, infer_target, inputs, interleaved

CLIENTS = 16
APP = "service.http.app:app_from_env"


@dataclass(frozen=True)
class Workload:
    name: str
    unit: str
    connections: int
    target: Callable[[int], Target]
    value: Callable[[LoadResult], float]
    higher_is_better: bool = True
    min_seconds: int = 1  # rounds at least this long: enough whole responses of the slow workloads


def _plain_env(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSENC_")}
    return {**env, "PYTHONPATH": str(ROOT), "POSENC_PORT": str(port)}


def log_config_file(work_dir: Path) -> Path:
    """posenc's own logging configuration (what `posenc serve` hands uvicorn) as a JSON file for other servers."""
    from service.http.logs import log_config
    from service.settings import Settings

    path = work_dir / "log-config.json"
    path.write_text(json.dumps(log_config(Settings())))
    return path


def uvicorn_service(name: str, http: str, log_dir: Path) -> Service:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", APP, "--factory", "--host", "127.0.0.1", "--port", str(port),
            "--loop", "uvloop", "--http", http, "--no-access-log", "--log-config", str(log_config_file(log_dir))]
    return Service(name, argv, _plain_env(port), port, log_dir)


def granian_service(log_dir: Path) -> Service | None:
    try:
        import granian  # noqa: F401
    except ImportError:
        return None
    port = free_port()
    argv = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory", "--host", "127.0.0.1", "--port",
            str(port), "--loop", "uvloop", "--http", "1", "--no-ws", "--workers", "1", "--no-access-log",
            "--log-config", str(log_config_file(log_dir)), APP]
    return Service("granian", argv, _plain_env(port), port, log_dir)


def workloads(work_dir: Path) -> list[Workload]:
    single = inputs(1, 64)
    large_infer = inputs(8, 512)
    return [
        Workload("cached small table", "req/s", CLIENTS, lambda p: Target(p, SMALL), lambda r: r.rps),
        Workload("/healthz", "req/s", CLIENTS, lambda p: Target(p, "/healthz"), lambda r: r.rps),
        Workload("cached 64 MiB table", "GB/s", CLIENTS, lambda p: Target(p, LARGE), lambda r: r.gbps,
                 min_seconds=4),
        Workload("infer 16 clients B=1 S=64", "req/s", CLIENTS, lambda p: infer_target(p, single, work_dir),
                 lambda r: r.rps),
        Workload("infer 1 client B=8 S=512", "ms", 1, lambda p: infer_target(p, large_infer, work_dir),
                 lambda r: r.p50_ms, higher_is_better=False, min_seconds=3),
    ]


def measure(load: LoadGen, servers: list[Service], workload: Workload, args: argparse.Namespace) -> list[float]:
    """Median value per server over interleaved rounds (rounds with errors count as 0 / inf)."""
    def side(server: Service) -> Callable[[], float]:
        target = workload.target(server.port)
        seconds = max(args.seconds, workload.min_seconds)
        load.round(target, 1, workload.connections)  # warm-up, not counted: fills the caches of every worker

        def one() -> float:
            result = load.round(target, seconds, workload.connections)
            if result.errors or not result.requests:
                print(f"# {server.name}: {result.errors} errors of {result.requests} requests ({workload.name})",
                      flush=True)
                return 0.0 if workload.higher_is_better else float("inf")
            return workload.value(result)
        return one

    rounds = interleaved(args.rounds, *(side(server) for server in servers))
    return [statistics.median(values) for values in rounds]


def table(servers: list[Service], results: list[tuple[Workload, list[float]]]) -> str:
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


def run(args: argparse.Namespace, work_dir: Path) -> str:
    load = LoadGen(work_dir)
    print("\n".join(machine_header()), f"# load: {load.describe()}; {args.rounds} x {args.seconds} s rounds",
          sep="\n", flush=True)
    servers = [posenc_service("posenc serve", {}, work_dir),
               uvicorn_service("uvicorn httptools", "httptools", work_dir),
               uvicorn_service("uvicorn h11", "h11", work_dir),
               posenc_service("2 workers", {"workers": "2"}, work_dir)]
    granian = granian_service(work_dir)
    if granian is None:
        print("# granian: not installed (pip install granian to include it)", flush=True)
    else:
        servers.append(granian)
    try:
        for server in servers:
            server.wait_ready("/readyz")
        results = []
        for workload in workloads(work_dir):
            results.append((workload, measure(load, servers, workload, args)))
            print(f"# {workload.name} done", flush=True)
        return table(servers, results)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        stop_all(servers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=int, default=2, help="seconds per round and server (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per server (default 3)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="posenc-servers-") as tmp:
        print("\n" + run(args, Path(tmp)))
    print(f"\n# {time.monotonic() - started:.0f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
