"""tables: cached tables and /healthz against a bare FastAPI endpoint serving the same bytes.

posenc (`python -m posenc.service.cli serve`, default settings: access log and metrics on) and the anchor (a bare
FastAPI app on the same uvicorn, loop and HTTP implementation, access log off, serving from `async def` the
bytes and headers captured from posenc: bench/anchor.py), each on a free loopback port, measured in
interleaved rounds, with a second anchor measured in the same rounds as the control (two identical sides;
beyond 3 % apart a row says NOISY, bench/isolation.py). Each side is `--replicas` server processes (3; 1 with
--quick) taking its rounds in turn (nine by default), as in `bench batching`; each ratio is read from the paired
rounds, and one within two standard errors of its target says NOISY as well:
  small    req/s of the cached `/v1/alibi/slopes?num_heads=32` (16 connections), target >= 1.0
  healthz  req/s of `/healthz` vs the anchor returning the same JSON (16 connections), target >= 0.85
  large    GB/s of the cached 64 MiB `/v1/rope?max_position=65536&head_dim=128` safetensors table, whole
           bodies read (`--large-connections`), target >= 0.90

Uncached tables, computed in row blocks on every core against the one-piece computation of before
(`POSENC_TABLE_BLOCK_BYTES=0`), for the 131,072 x 128 RoPE table (cos and sin: 128 MiB of float32):
  compute  GB/s of the computation alone, in this process: `RowBlocks` with the service's defaults (one thread
           per core, glibc's heaps set as the server sets them) vs `query.compute()`, target >= 1.7; on one
           thread (the split alone), and the process's CPU time per table (what other load cannot take away),
           informational
  served   GB/s of the whole uncached request (compute, encode, send), one client, two servers with the table
           cache off, one with row blocks and one without, informational (not with --quick)
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.harness import (
    CLIENTS,
    LARGE,
    SMALL,
    Bench,
    Report,
    Row,
    Target,
    call_ms,
    in_turn,
    interleaved,
    load_rounds,
    log,
    med,
    replicas_of,
    spread,
)
from bench.isolation import on_cores, paired
from posenc.service.budget import configure_malloc
from posenc.service.settings import Settings
from posenc.service.tables.blocks import RowBlocks
from posenc.service.tables.rope import RopeQuery
from posenc.service.testing import LoadResult, ServerProcess, http_request

UNCACHED_ROWS, UNCACHED_HEAD_DIM = 131072, 128  # cos and sin: 128 MiB of float32
UNCACHED = f"/v1/rope?max_position={UNCACHED_ROWS}&head_dim={UNCACHED_HEAD_DIM}&format=safetensors"


def capture_tables(posenc: ServerProcess, work_dir: Path) -> tuple[Path, str]:
    """Fill posenc's cache (first request of a table is a miss), check the second one hits, and write the
    anchor's spec: the same bytes, media type and headers (date/server/content-length are the server's)."""
    spec: dict[str, Any] = {"raw": {}, "json": {}}
    notes = []
    for name, path in (("small", SMALL), ("large", LARGE)):
        status = http_request(posenc.port, path)[0]
        status2, headers, body = http_request(posenc.port, path)
        if status != 200 or status2 != 200:
            raise RuntimeError(f"posenc answered {status}/{status2} to {path}")
        notes.append(f"{name} {len(body)} B x-cache={headers.get('x-cache', '?')}")
        (work_dir / f"{name}.bin").write_bytes(body)
        copied = {k: v for k, v in headers.items() if k not in ("date", "server", "content-length", "content-type")}
        spec["raw"][path.split("?")[0]] = {"file": str(work_dir / f"{name}.bin"),
                                           "media_type": headers["content-type"], "headers": copied}
    spec["json"]["/healthz"] = json.loads(http_request(posenc.port, "/healthz")[2])
    spec_path = work_dir / "anchor.json"
    spec_path.write_text(json.dumps(spec))
    return spec_path, ", ".join(notes)


def run(bench: Bench) -> Report:
    args, load = bench.args, bench.load
    replicas, rounds = replicas_of(args), load_rounds(args)
    report = Report(notes=["# tables: posenc serve (POSENC_* unset) vs the anchor: bare FastAPI async def endpoints "
                           "on uvicorn --loop uvloop --http httptools --no-access-log, same bytes, media type and "
                           f"headers; {rounds} x {args.seconds} s rounds per side, interleaved, taken in turn by "
                           f"{replicas} server process(es) per side"])
    with bench.servers() as servers:
        # each side is `replicas` server processes taking its rounds in turn (bench/harness.py in_turn)
        posencs = [servers.start(f"posenc {i + 1}") for i in range(replicas)]
        servers.ready("/readyz")
        spec_path, cache_note = capture_tables(posencs[0], bench.work_dir)
        report.notes.append(f"# tables: {cache_note}")
        command = [sys.executable, "-m", "uvicorn", "bench.anchor:create_app", "--factory", "--host", "{host}",
                   "--port", "{port}", "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level",
                   "warning"]
        env = {"BENCH_ANCHOR_SPEC": str(spec_path)}
        anchors = [servers.start(f"anchor {i + 1}", command=command, env=env) for i in range(replicas)]
        # the control: the same anchor again, measured in the same rounds (two identical sides must agree)
        twins = [servers.start(f"anchor, the same again {i + 1}", command=command, env=env) for i in range(replicas)]
        for server in (*anchors, *twins):
            server.wait_ready("/healthz")
        cases = [(f"cached small table {SMALL}", SMALL, CLIENTS, False, 1.0),
                 ("/healthz", "/healthz", CLIENTS, False, 0.85),
                 ("cached 64 MiB table /v1/rope (65536x128, safetensors)", LARGE, args.large_connections, True, 0.90)]
        for what, path, conns, gbps, goal in cases:
            target = Target(path)  # the same URL to both
            for server in (*posencs, *anchors, *twins):
                load.round(server.port, target, 1, conns)  # warm-up (and each posenc's cache filled)
            one_round = partial(load.round, target=target, seconds=args.seconds, connections=conns)
            a, b, c = interleaved(rounds, *(in_turn(side, one_round) for side in (posencs, anchors, twins)))
            metric: Callable[[LoadResult], float] = (lambda r: r.gbps) if gbps else (lambda r: r.rps)
            va, vb, vc = [metric(r) for r in a], [metric(r) for r in b], [metric(r) for r in c]
            report.rows.append(Row(
                f"{what}, {conns} conn", med(va), med(vb), "GB/s" if gbps else "req/s", True, goal,
                f"{spread(va, vb)}; p50 {med([r.p50_ms for r in a]):.2f}/{med([r.p50_ms for r in b]):.2f} ms",
                sum(r.errors for r in a + b), control=paired(vc, vb).ratio, paired=paired(va, vb)))
            log(f"{report.rows[-1].what}: {report.rows[-1].ratio:.3f}")
    with on_cores(bench.cores.serve | bench.cores.load):  # in this process, on every core: no load generator runs
        compute_rows(bench, report, args.rounds or 5)
    if not args.quick:
        served_rows(bench, report, args.rounds or 5)
    return report


def compute_rows(bench: Bench, report: Report, rounds: int) -> None:
    """The uncached RoPE table's computation in this process: row blocks (the service's defaults, then one
    thread) against the one-piece computation, rounds interleaved."""
    query = RopeQuery(max_position=UNCACHED_ROWS, head_dim=UNCACHED_HEAD_DIM)
    specs = query.specs()
    gigabytes = sum(spec.nbytes for spec in specs.values()) / 1e9
    defaults = Settings()
    configure_malloc(defaults.malloc_arenas, defaults.malloc_keep_bytes)  # as the server sets it at start-up
    blocks = RowBlocks(defaults.table_threads, defaults.table_block_bytes)
    one_thread = RowBlocks(1, defaults.table_block_bytes)
    old, new, single = interleaved(rounds, timed(query.compute), timed(lambda: blocks.compute(query, specs)),
                                   timed(lambda: one_thread.compute(query, specs)))
    blocks.close()
    one_thread.close()
    what = f"uncached {UNCACHED_ROWS}x{UNCACHED_HEAD_DIM} RoPE compute: row blocks vs one piece"
    old_ms = [wall for wall, _ in old]
    for label, sides, goal in ((f"{what}, {blocks.threads} threads", new, 1.7), (f"{what}, 1 thread", single, None)):
        times = [wall for wall, _ in sides]
        report.rows.append(Row(label, gigabytes / (med(times) / 1000), gigabytes / (med(old_ms) / 1000), "GB/s", True,
                               goal, f"{spread([1 / t for t in times], [1 / t for t in old_ms])}; "
                               f"{med(times):.0f}/{med(old_ms):.0f} ms"))
        log(f"{label}: {report.rows[-1].ratio:.3f}")
    # CPU time is what other processes on a shared machine cannot take away: the split's own gain per core
    report.rows.append(Row(f"{what}: CPU time of this process per table, {blocks.threads} threads",
                           med([cpu for _, cpu in new]), med([cpu for _, cpu in old]), "s", False, None,
                           spread([cpu for _, cpu in new], [cpu for _, cpu in old], higher_is_better=False)))
    log(f"{report.rows[-1].what}: {report.rows[-1].ratio:.3f}")


def timed(fn: Callable[[], object]) -> Callable[[], tuple[float, float]]:
    """A side of `interleaved`: one call of `fn`, its wall milliseconds and this process's CPU seconds."""
    def side() -> tuple[float, float]:
        before, start = os.times(), time.perf_counter()
        fn()
        wall, after = 1000 * (time.perf_counter() - start), os.times()
        return wall, after.user + after.system - before.user - before.system
    return side


def served_rows(bench: Bench, report: Report, rounds: int) -> None:
    """The whole uncached request (cache off): a server with row blocks against one without, one client."""
    with bench.servers() as servers:
        blocked = servers.start("posenc, row blocks", {"cache_bytes": 0})
        whole = servers.start("posenc, one piece", {"cache_bytes": 0, "table_block_bytes": 0})
        servers.ready("/readyz")

        sizes: list[int] = []

        def fetch(server: ServerProcess) -> Callable[[], float]:
            def one() -> None:
                status, _, body = http_request(server.port, UNCACHED, timeout=120)
                if status != 200:
                    raise RuntimeError(f"{server.name} answered {status} to {UNCACHED}")
                sizes.append(len(body))
            return call_ms(one)

        fetch(blocked)(), fetch(whole)()  # warm-up
        new, old = interleaved(max(rounds, 3), fetch(blocked), fetch(whole))
    gigabytes = sizes[0] / 1e9
    report.rows.append(Row(f"uncached {UNCACHED_ROWS}x{UNCACHED_HEAD_DIM} RoPE request, served (compute, encode, "
                           "send): row blocks vs one piece, 1 client", gigabytes / (med(new) / 1000),
                           gigabytes / (med(old) / 1000), "GB/s", True, None,
                           f"{spread([1 / t for t in new], [1 / t for t in old])}; {med(new):.0f}/{med(old):.0f} ms"))
    log(f"{report.rows[-1].what}: {report.rows[-1].ratio:.3f}")
