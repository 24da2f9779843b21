"""batching: concurrent clients of single-row binary infer, posenc with batching on vs off; and what one row costs
onnxruntime by batch size (where batching pays).

    python -m bench batching                       # S = 16, 64, 256 (about 4 minutes on 2 cores)
    python -m bench batching --seq 64 --rounds 3 --replicas 1

Two sides, default settings but POSENC_BATCHING=true / false, `--clients` (16) keep-alive connections
each sending single-row rope_attention requests, rounds interleaved: req/s (ratio on/off from the paired
rounds, target >= 0.97), median latency, and the mean rows per onnxruntime run (the model's statistics over the
rounds). A third side with the same settings as the first, measured in the same rounds, is the control: its
ratio to the first is what two equal sides differ by in that run: beyond 3 % the on/off row says NOISY (too noisy
to judge). Rounds are added, one per server process at a time, until the on/off ratio and the control each have a
standard error of 1.5 % or less (bench/isolation.py), up to `--most-rounds` (three times `--rounds`; none added
with --quick); an on/off ratio still within two standard errors of 0.97 says NOISY.
Each side is `--replicas` server processes (3; 1 with --quick) that take its rounds in turn: two
processes of one server differ by up to 4 % in req/s on a VM (docs/performance.md), more than the rounds
of one process do, so one process per side cannot resolve a 3 % target. With pinning (bench/isolation.py)
the servers share one core set and the clients run on the other.
Then onnxruntime's milliseconds per row for B = 1, 2, 4, 8, 16 at S = 64 and 256 in its own process on the
servers' CPUs (every B in every round; ratio: the per-row speed-up over B=1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from bench.harness import (
    MODEL,
    Bench,
    Report,
    Row,
    in_turn,
    infer_target,
    inputs,
    interleaved,
    interleaved_until,
    load_rounds,
    log,
    med,
    model_stats,
    replicas_of,
    spread,
)
from bench.inprocess import graph_path
from bench.isolation import RESOLUTION, AnchorProcess, alone, paired
from posenc.service.testing import ServerProcess

SEQS = (16, 64, 256)
PER_ROW_BATCHES, PER_ROW_SEQS = (1, 2, 4, 8, 16), (64, 256)
TARGET = 0.97
# the three sides: batching on, off, and the control (a second side like the first)
SIDES: dict[str, dict[str, object]] = {"posenc": {}, "posenc batching off": {"batching": False},
                                       "posenc, the same again": {}}


def rows_per_run(side: Sequence[ServerProcess], before: Mapping[str, tuple[int, int]]) -> float:
    """Mean rows per onnxruntime run of a side's servers since `before` (each model's statistics then, by server
    name)."""
    rows = runs = 0
    for server in side:
        now = model_stats(server.port)
        rows, runs = rows + now[0] - before[server.name][0], runs + now[1] - before[server.name][1]
    return rows / max(1, runs)


def precise(rounds: list[list[float]]) -> bool:
    """Whether the on/off ratio and the control (req/s of on, off, on again, by round) each have a standard
    error of RESOLUTION or less."""
    on, off, twin = rounds
    errors = paired(on, off).error, paired(twin, on).error
    return all(error is not None and error <= RESOLUTION for error in errors)


def most_rounds(args: object, rounds: int) -> int:
    """The rounds per side a run may go to: --most-rounds, else three times its first rounds (none more with
    --quick)."""
    if getattr(args, "quick", False):
        return rounds
    return max(rounds, int(getattr(args, "most_rounds", None) or 3 * rounds))


def on_off(bench: Bench, report: Report) -> None:
    args, load = bench.args, bench.load
    quick = getattr(args, "quick", False)
    replicas = replicas_of(args)
    rounds, clients, seconds = load_rounds(args), args.clients, 1 if quick else args.seconds
    table = [f"| {clients} concurrent clients, single requests ({MODEL}) | batching | requests/s | median latency "
             "| mean rows per onnxruntime run |", "|---|---|---|---|---|"]
    with bench.servers() as servers:
        # each side is `replicas` server processes, taking the rounds in turn: what one process gains or loses
        # by itself (its placement in memory, in the caches) is averaged over several, as machine noise is
        # over the rounds
        sides = {name: [servers.start(f"{name} {i + 1}", settings) for i in range(replicas)]
                 for name, settings in SIDES.items()}
        servers.ready("/readyz")
        on, off, twin = sides.values()
        for seq in args.seq or SEQS:
            target = infer_target(inputs(1, seq), bench.work_dir)
            for server in (*on, *off, *twin):
                load.round(server.port, target, 1, clients)  # warm-up
            before = {server.name: model_stats(server.port) for server in (*on, *off, *twin)}
            one_round = partial(load.round, target=target, seconds=seconds, connections=clients)
            a, b, c = interleaved_until(lambda done: precise([[r.rps for r in side] for side in done]), rounds,
                                        most_rounds(args, rounds), replicas,
                                        *(in_turn(side, one_round) for side in (on, off, twin)))
            per_run = [rows_per_run(side, before) for side in (on, off, twin)]
            va, vb, vc = [r.rps for r in a], [r.rps for r in b], [r.rps for r in c]
            p50 = med([r.p50_ms for r in a]), med([r.p50_ms for r in b]), med([r.p50_ms for r in c])
            on_off_ratio, control = paired(va, vb), paired(vc, va)
            report.rows.append(Row(f"infer {clients} clients B=1 S={seq}, batching on vs off", med(va), med(vb),
                                   "req/s", True, TARGET, f"{len(va)} {spread(va, vb)}; p50 {p50[0]:.2f}/"
                                   f"{p50[1]:.2f} ms; {per_run[0]:.2f} rows/run batched", sum(r.errors for r in a + b),
                                   control=control.ratio, paired=on_off_ratio))
            log(f"{report.rows[-1].what}: {report.rows[-1].ratio:.3f} ({len(va)} rounds)")
            report.rows.append(Row(f"infer {clients} clients B=1 S={seq}, control: batching on vs on (two equal "
                                   "sides)", med(vc), med(va), "req/s", True, None,
                                   f"{spread(vc, va)}; the noise of this run", sum(r.errors for r in c),
                                   paired=control))
            log(f"{report.rows[-1].what}: {report.rows[-1].ratio:.3f}")
            for state, values, latency, rows in (("on", va, p50[0], per_run[0]), ("off", vb, p50[1], per_run[1]),
                                                 ("on (control)", vc, p50[2], per_run[2])):
                table.append(f"| B=1 S={seq} | {state} | {med(values):.0f} | {latency:.2f} ms | {rows:.1f} |")
    report.tables.append("\n".join(table))


def per_row(bench: Bench, report: Report) -> None:
    """onnxruntime ms per row for each batch size (every B in every round), with onnxruntime's default options
    (but the servers' threads), alone in its own process on the servers' CPUs."""
    args = bench.args
    with AnchorProcess("onnxruntime per row", bench.cores.serve, args.threads) as anchor:
        for seq in PER_ROW_SEQS:
            for batch in PER_ROW_BATCHES:
                anchor.load("ort", key=str(batch), model=MODEL, batch=batch, seq=seq,
                            path=graph_path(MODEL, "cpu", seq))
            per_call = interleaved(args.rounds or 5, *(alone(partial(anchor.burst, 3, str(batch)))
                                                       for batch in PER_ROW_BATCHES))
            per_row_rows(report, seq, per_call)


def per_row_rows(report: Report, seq: int, per_call: list[list[float]]) -> None:
    """The rows of one sequence length: each B's ms per row against B=1's."""
    rows = [[ms / batch for ms in calls] for batch, calls in zip(PER_ROW_BATCHES, per_call, strict=True)]
    for batch, values in zip(PER_ROW_BATCHES, rows, strict=True):
        report.rows.append(Row(f"onnxruntime per row B={batch} S={seq} (anchor: B=1)", med(values), med(rows[0]),
                               "ms/row", False, None, "ratio = per-row speed-up over B=1"))
    log(f"onnxruntime per-row cost S={seq} done")


def run(bench: Bench) -> Report:
    replicas = replicas_of(bench.args)
    report = Report(notes=["# batching: posenc serve with POSENC_BATCHING=true vs false (otherwise POSENC_* unset), "
                           f"{bench.args.clients} connections; the control: a third side like the first; {replicas} "
                           "server process(es) per side, taking its rounds in turn; "
                           "onnxruntime per row alone in its own process (default session options but the threads)"])
    on_off(bench, report)
    if not getattr(bench.args, "quick", False):  # --quick: the on/off ratios only
        per_row(bench, report)
    return report
