"""Every performance ratio of posenc, each measured side by side with its anchor in one run.

    python -m bench all                            # every sub-benchmark (about 8 minutes on 2 cores)
    python -m bench tables --rounds 3              # one of them
    python -m bench tables batching --check        # exit 1 when a ratio is below its target
    python -m bench tables --quick                 # fewer, shorter rounds (what CI prints): about a minute

Sub-benchmarks (each module's docstring says what it measures and against what):
  tables    cached small table, /healthz and the cached 64 MiB table vs a bare FastAPI endpoint (bench/tables.py)
  batching  16 clients of single-row infer, batching on vs off; onnxruntime's cost per row by B (bench/batching.py)
  infer     one binary infer over HTTP vs the transport alone, shared memory, in-process onnxruntime and torch
            eager, on CPU or CUDA (bench/infer.py)
  servers   the same app on uvicorn (httptools, h11), 2 workers and granian (bench/servers.py)
Every pair is measured in interleaved rounds, so machine noise hits both sides alike; ratios are oriented so
that higher is better for posenc, rows without a target are informational. The ratio table comes last.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import CLIENTS, Bench, Load, Row, format_table, machine_header

BENCHMARKS = ("tables", "batching", "infer", "servers")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=(__doc__ or "").split("\n\n")[0],
                                     epilog="Each sub-benchmark reads the options that concern it.")
    parser.add_argument("benchmarks", nargs="+", choices=[*BENCHMARKS, "all"], metavar="BENCHMARK",
                        help=f"one or more of {', '.join(BENCHMARKS)}, or all")
    parser.add_argument("--check", action="store_true", help="exit 1 if any ratio is below its target")
    parser.add_argument("--quick", action="store_true", help="fewer and shorter rounds (unless given: --seconds 1, "
                        "--rounds 2, --repeat 3): ratios in about a minute per sub-benchmark, noisier")
    parser.add_argument("--seconds", type=int, help="seconds per load round and side (default 2; quick 1)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per side (default 5; servers 3; quick 2)")
    parser.add_argument("--no-wrk", action="store_true", help="the Python load generator even if wrk exists")
    parser.add_argument("--large-connections", type=int, default=CLIENTS, help="tables: connections, 64 MiB row")
    parser.add_argument("--clients", type=int, default=CLIENTS, help="batching: concurrent clients (default 16)")
    parser.add_argument("--seq", type=int, action="append", help="batching: a sequence length (repeatable; "
                        "default 16, 64, 256)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="infer: where every column runs: the server (POSENC_PROVIDERS), onnxruntime and torch")
    parser.add_argument("--case", action="append", metavar="MODEL:B:S",
                        help="infer: a latency case (repeatable); default: a small set per device")
    parser.add_argument("--repeat", type=int, help="infer: timed calls per column (median reported; default 9, "
                        "quick 3)")
    parser.add_argument("--threads", type=int, default=0,
                        help="infer: the server's intra-op threads and torch's threads (default 0: each one's own "
                        "default; the onnxruntime anchor always runs with onnxruntime's defaults)")
    args = parser.parse_args(argv)
    # quick: every sub-benchmark reads these three, so each runs fewer, shorter rounds
    args.seconds = args.seconds if args.seconds is not None else (1 if args.quick else 2)
    args.repeat = args.repeat if args.repeat is not None else (3 if args.quick else 9)
    if args.quick and args.rounds is None:
        args.rounds = 2
    if args.seconds < 1 or (args.rounds is not None and args.rounds < 1) or args.repeat < 1:
        parser.error("--seconds, --rounds and --repeat must be at least 1")
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
    try:
        with tempfile.TemporaryDirectory(prefix="posenc-bench-") as tmp:
            bench = Bench(Path(tmp), Load(Path(tmp), prefer_wrk=not args.no_wrk), args)
            print("\n".join([*machine_header(), f"# load: {bench.load.describe()}"]), flush=True)
            for name in args.benchmarks:
                report = importlib.import_module(f"bench.{name}").run(bench)
                print("\n".join(report.notes), flush=True)
                for table in report.tables:
                    print(f"\n{table}\n", flush=True)
                rows += report.rows
    except KeyboardInterrupt:
        print("interrupted: every server was stopped", file=sys.stderr)
        return 130
    if rows:
        print("\n# rows 'X vs Y': X in the posenc column, Y in the anchor column\n" + format_table(rows))
    print(f"\n# {time.monotonic() - started:.0f} s in all", flush=True)
    failing = [r for r in rows if r.status in ("BELOW", "ERROR")]
    return 1 if args.check and failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
