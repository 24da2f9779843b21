"""Every performance ratio of posenc, each measured side by side with its anchor in one run.

    python -m bench all                            # every sub-benchmark (about 8 minutes on 2 cores)
    python -m bench tables --rounds 3              # one of them
    python -m bench tables batching --check        # exit 1 when a ratio is below its target
    python -m bench tables --quick                 # fewer, shorter rounds (what CI prints): about a minute

Sub-benchmarks (each module's docstring says what it measures and against what):
  tables    cached small table, /healthz and the cached 64 MiB table vs a bare FastAPI endpoint (bench/tables.py)
  batching  16 clients of single-row infer, batching on vs off; onnxruntime's cost per row by B (bench/batching.py)
  infer     one binary infer over HTTP vs the transport alone, shared memory, in-process onnxruntime and torch
            eager, on CPU or CUDA (bench/infer.py); on the CPU, posenc vs KServe, PyTriton and LitServe serving the
            same graph, at 1 and 8 clients (bench/peer_columns.py)
  servers   the same app on uvicorn (httptools, h11), 2 workers and granian (bench/servers.py)
  forms     (not in `all`) the attention graphs onnxruntime can run against torch eager, each alone (bench/forms.py)
Every pair is measured in interleaved rounds, so machine noise hits both sides alike; ratios are oriented so
that higher is better for posenc, rows without a target are informational. The ratio table comes last.
With 2 or more CPUs the servers and their anchors run on one half of them and the load generator on the other
(--no-pin: everything shares every CPU); each in-process anchor runs alone in its own process; a control (two
identical sides) that differs by more than 3 % marks the run too noisy to judge, and so does a ratio within two
standard errors of its target where its rounds give one (bench/isolation.py).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import (
    CLIENTS,
    REPOSITORY_ENV,
    Bench,
    Load,
    Row,
    calibrated_repository,
    format_table,
    machine_header,
    rule_summary,
)
from bench.isolation import NOISE_LIMIT, cpu_summary, plan_cores

BENCHMARKS = ("tables", "batching", "infer", "servers")
INVESTIGATIONS = ("forms",)  # run when named, not by `all`
# the benchmarks that run inference: they run it on the graphs a calibration on the servers' CPUs chose (tables
# and forms do not: forms times every graph itself)
INFERENCE = frozenset({"batching", "infer", "servers"})


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").split("\n\n")[0],
                                     epilog="Each sub-benchmark reads the options that concern it.")
    parser.add_argument("benchmarks", nargs="+", choices=[*BENCHMARKS, *INVESTIGATIONS, "all"], metavar="BENCHMARK",
                        help=f"one or more of {', '.join(BENCHMARKS)}, or all; or {', '.join(INVESTIGATIONS)}")
    parser.add_argument("--check", action="store_true", help="exit 1 if any ratio is below its target; exit 3, "
                        "too noisy to judge, if a control of a row with a target differs by more than 3 %% or its "
                        "ratio lies within two standard errors of the target")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                        help="servers and anchors on one half of the CPUs, the load generator on the other "
                        "(default: with 2 or more CPUs)")
    parser.add_argument("--quick", action="store_true", help="fewer and shorter rounds (unless given: --seconds 1, "
                        "--rounds 2, --repeat 3): ratios in about a minute per sub-benchmark, noisier")
    parser.add_argument("--seconds", type=int, help="seconds per load round and side (default 2; quick 1)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per side (default 5; batching and tables 3 "
                        "per replica; servers 3; quick 2)")
    parser.add_argument("--no-wrk", action="store_true", help="the Python load generator even if wrk exists")
    parser.add_argument("--large-connections", type=int, default=CLIENTS, help="tables: connections, 64 MiB row")
    parser.add_argument("--most-rounds", type=int, help="batching: rounds per side it may add (one per replica at a "
                        "time) until its ratios' standard errors are 1.5 %% or less (default three times --rounds; "
                        "quick: none added)")
    parser.add_argument("--replicas", type=int, help="batching, tables: server processes per side, taking its "
                        "rounds in turn (default 3, with nine rounds; quick 1)")
    parser.add_argument("--clients", type=int, default=CLIENTS, help="batching: concurrent clients (default 16)")
    parser.add_argument("--seq", type=int, action="append", help="batching: a sequence length (repeatable; "
                        "default 16, 64, 256)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="infer: where every column runs: the server (POSENC_PROVIDERS), onnxruntime and torch")
    parser.add_argument("--case", action="append", metavar="MODEL:B:S",
                        help="infer, forms: a case (repeatable); default: a small set per device")
    parser.add_argument("--repeat", type=int, help="infer: timed calls per column (median reported; default 9, "
                        "quick 3)")
    parser.add_argument("--threads", type=int, default=0,
                        help="infer: the intra-op threads of the servers and the onnxruntime anchor, and torch's "
                        "threads (default 0: one per CPU of the servers' set)")
    parser.add_argument("--kserve", action=argparse.BooleanOptionalAction, default=None,
                        help="infer: KServe's Python ModelServer as a column (its own virtual environment, made on "
                        "first use; default: on, with --quick only where that environment exists)")
    for peer, name in (("pytriton", "NVIDIA PyTriton (HTTP and gRPC)"), ("litserve", "LitServe (HTTP)")):
        parser.add_argument(f"--{peer}", action=argparse.BooleanOptionalAction, default=None,
                            help=f"infer: {name} as a peer at 1 and 8 clients (bench/peer_columns.py; its own virtual "
                            "environment, made on first use; default: on, with --quick only where that environment "
                            "exists)")
    args = parser.parse_args(argv)
    # quick: every sub-benchmark reads these three, so each runs fewer, shorter rounds
    args.seconds = args.seconds if args.seconds is not None else (1 if args.quick else 2)
    args.repeat = args.repeat if args.repeat is not None else (3 if args.quick else 9)
    if args.quick and args.rounds is None:
        args.rounds = 2
    if (args.seconds < 1 or args.repeat < 1
            or any(value is not None and value < 1 for value in (args.rounds, args.replicas, args.most_rounds))):
        parser.error("--seconds, --rounds, --most-rounds, --repeat and --replicas must be at least 1")
    if args.case:
        from bench.infer import parse_case
        try:
            args.case = [parse_case(text) for text in args.case]
        except ValueError:
            parser.error("--case takes MODEL:B:S, e.g. rope_attention:8:512")
    args.benchmarks = list(BENCHMARKS) if "all" in args.benchmarks else list(dict.fromkeys(args.benchmarks))
    return args


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through `finally`: servers are stopped
    args = parse_args(argv)
    started = time.monotonic()
    rows: list[Row] = []
    cores = plan_cores(args.pin)
    args.threads = args.threads or cores.threads
    if cores.pinned:
        os.sched_setaffinity(0, cores.load)  # this process is the HTTP client; servers and anchors start elsewhere
    try:
        with tempfile.TemporaryDirectory(prefix="posenc-bench-") as tmp:
            bench = Bench(Path(tmp), Load(Path(tmp), prefer_wrk=not args.no_wrk), args, cores)
            print("\n".join([*machine_header(cores, args.threads), f"# load: {bench.load.describe()}"]), flush=True)
            if args.device == "cpu" and INFERENCE & set(args.benchmarks):
                os.environ[REPOSITORY_ENV] = str(calibrated_repository(Path(tmp), cores, args.threads))
                print(rule_summary(Path(os.environ[REPOSITORY_ENV])), flush=True)
            for name in args.benchmarks:
                report = importlib.import_module(f"bench.{name}").run(bench)
                print("\n".join(report.notes), flush=True)
                for table in report.tables:
                    print(f"\n{cpu_summary(cores, args.threads)}\n{table}\n", flush=True)
                rows += report.rows
    except KeyboardInterrupt:
        print("interrupted: every server was stopped", file=sys.stderr)
        return 130
    finally:
        os.environ.pop(REPOSITORY_ENV, None)  # the run's copy is gone with its folder
    if rows:
        print(f"\n{cpu_summary(cores, args.threads)}\n# rows 'X vs Y': X in the posenc column, Y in the anchor column\n"
              + format_table(rows))
    print(f"\n# {time.monotonic() - started:.0f} s in all", flush=True)
    failing = [r for r in rows if r.status in ("BELOW", "ERROR")]
    noisy = [r for r in rows if r.status == "NOISY"]
    if noisy:
        print(f"# too noisy to judge: {len(noisy)} row(s) whose control (two identical sides) differs by more than "
              f"{NOISE_LIMIT:.0%}, or whose ratio lies within two standard errors (±) of its target: "
              + "; ".join(r.what for r in noisy), flush=True)
    if args.check and noisy:
        print("# --check: too noisy to judge (no PASS or BELOW is claimed for those rows)", flush=True)
        return 3
    return 1 if args.check and failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
