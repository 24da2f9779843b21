"""Every ratio of the performance targets, each measured side by side with its anchor in one run.

    python bench/ratios.py                                   # full run (about 4 minutes on 2 cores)
    python bench/ratios.py --only small,healthz --rounds 3   # a subset
    python bench/ratios.py --check                           # exit 1 when a ratio is below its target

The script starts posenc (`python -m service.cli serve`, default settings: access log and metrics on), a
second posenc with POSENC_BATCHING=false, and the anchor (a bare FastAPI app on uvicorn, same loop and HTTP
implementation, access log off, serving from `async def` the bytes and headers captured from posenc), each
on a free loopback port. Every pair is measured in interleaved rounds (posenc, anchor, anchor, posenc, ...;
`--rounds` x `--seconds`), the value of a side is the median of its rounds, so machine noise hits both.

Row groups (`--only`):
  small     req/s of the cached `/v1/alibi/slopes?num_heads=32` vs the anchor (16 connections)
  healthz   req/s of `/healthz` vs the anchor returning the same JSON (16 connections)
  large     GB/s of the cached 64 MiB `/v1/rope?max_position=65536&head_dim=128` safetensors table vs the
            anchor (whole bodies read; `--large-connections`)
  batching  req/s of 16 clients sending single-row binary infer requests to rope_attention (S=16, 64, 256),
            POSENC_BATCHING=true vs false (two servers, interleaved rounds)
  infer     median latency of one binary HTTP infer (one client) vs the same `run` in-process on an
            onnxruntime session built like the server's (B=1 S=128, B=8 S=512)
  ort       onnxruntime vs torch eager (`models.rope_attention`) on the same inputs, and onnxruntime ms per
            row for B=1..16 at S=64 and 256 (ratio: per-row speed-up over B=1, i.e. where batching pays)
Ratios are oriented so that higher is better for posenc; rows without a target are informational.
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
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    ROOT,
    LoadGen,
    LoadResult,
    Row,
    Service,
    Target,
    anchor_service,
    format_table,
    http_request,
    machine_header,
    posenc_service,
    stop_all,
)

T = TypeVar("T")
GROUPS = ("small", "healthz", "large", "batching", "infer", "ort")
SMALL = "/v1/alibi/slopes?num_heads=32"
LARGE = "/v1/rope?max_position=65536&head_dim=128&format=safetensors"
MODEL = "rope_attention"
CONFIG: dict[str, Any] = json.loads((ROOT / "onnx" / MODEL / "config.json").read_text())
HQ, HKV, DIM = (CONFIG["attention"][k] for k in ("num_heads", "num_kv_heads", "head_dim"))
CLIENTS = 16
BATCHING_SEQS = (16, 64, 256)
INFER_CASES = ((1, 128), (8, 512))
PER_ROW_BATCHES, PER_ROW_SEQS = (1, 2, 4, 8, 16), (64, 256)


def log(message: str) -> None:
    print(f".. {message}", file=sys.stderr, flush=True)


def interleaved(rounds: int, *sides: Callable[[], T]) -> list[list[T]]:
    """`rounds` rounds of every side, the order reversed every other round (AB, BA, AB, ...) so that drift
    and noise hit all sides alike; one list of results per side."""
    results: list[list[T]] = [[] for _ in sides]
    for i in range(rounds):
        order = list(enumerate(sides))
        for k, side in order if i % 2 == 0 else order[::-1]:
            results[k].append(side())
    return results


def spread(mine: list[float], theirs: list[float], higher_is_better: bool = True) -> str:
    """The range of the per-round ratios (round i of posenc against round i of the anchor): the noise."""
    ratios = [m / t if higher_is_better else t / m for m, t in zip(mine, theirs, strict=True) if m and t]
    return f"rounds {min(ratios):.2f}-{max(ratios):.2f}" if ratios else "no rounds"


def inputs(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """rope_attention inputs: query/key/value [B, 8, S, 64] float32, position_ids [B, S] int64."""
    rng = np.random.default_rng(seed)
    return {"query": rng.standard_normal((batch, HQ, seq, DIM), dtype=np.float32),
            "key": rng.standard_normal((batch, HKV, seq, DIM), dtype=np.float32),
            "value": rng.standard_normal((batch, HKV, seq, DIM), dtype=np.float32),
            "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1))}


def infer_target(port: int, arrays: dict[str, np.ndarray], work_dir: Path) -> Target:
    """A binary-tensor KServe v2 request (JSON header, then raw tensors; binary output requested)."""
    kinds = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
    header = {"inputs": [{"name": n, "datatype": kinds[a.dtype], "shape": list(a.shape),
                          "parameters": {"binary_data_size": a.nbytes}} for n, a in arrays.items()],
              "parameters": {"binary_data_output": True}}
    head = json.dumps(header).encode()
    body = head + b"".join(a.tobytes() for a in arrays.values())
    shape = "x".join(map(str, arrays["query"].shape))
    body_file = work_dir / f"infer-{shape}.bin"
    body_file.write_bytes(body)
    return Target(port, f"/v2/models/{MODEL}/infer", "POST", body, body_file=body_file,
                  headers={"Inference-Header-Content-Length": str(len(head)),
                           "Content-Type": "application/octet-stream"})


def decode_output(body: bytes, headers: dict[str, str]) -> np.ndarray:
    length = int(headers["inference-header-content-length"])
    shape = json.loads(body[:length])["outputs"][0]["shape"]
    return np.frombuffer(body[length:], np.float32).reshape(shape)


def session() -> ort.InferenceSession:
    """An onnxruntime session built like posenc's (service/inference/repository.py): intra-op threads = usable cores,
    one inter-op thread, no spinning, CPU provider."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = len(os.sched_getaffinity(0))
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(ROOT / "onnx" / MODEL / "model.onnx"), sess_options=options,
                                providers=["CPUExecutionProvider"])


def timed_ms(fn: Callable[[], object], seconds: float, min_calls: int = 3) -> float:
    """Median milliseconds per call of `fn`, called repeatedly for `seconds` (at least `min_calls` times)."""
    times: list[float] = []
    end = time.perf_counter() + seconds
    while len(times) < min_calls or time.perf_counter() < end:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def med(values: list[float]) -> float:
    return statistics.median(values)


def capture_tables(posenc: Service, work_dir: Path) -> tuple[Path, str]:
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


def http_rows(groups: set[str], load: LoadGen, posenc: Service, anchor: Service, args: argparse.Namespace) -> list[Row]:
    """small / healthz: req/s with 16 connections; large: GB/s of whole 64 MiB bodies. Same URL to both."""
    cases = [("small", f"cached small table {SMALL}", SMALL, CLIENTS, False, 0.80),
             ("healthz", "/healthz", "/healthz", CLIENTS, False, 0.85),
             ("large", "cached 64 MiB table /v1/rope (65536x128, safetensors)", LARGE, args.large_connections,
              True, 0.90)]
    rows = []
    for group, what, path, conns, gbps, target in cases:
        if group not in groups:
            continue
        mine, theirs = Target(posenc.port, path), Target(anchor.port, path)
        load.round(mine, 1, conns), load.round(theirs, 1, conns)  # warm-up (connections, allocator, caches)
        a, b = interleaved(args.rounds, lambda m=mine, c=conns: load.round(m, args.seconds, c),
                           lambda t=theirs, c=conns: load.round(t, args.seconds, c))
        metric: Callable[[LoadResult], float] = (lambda r: r.gbps) if gbps else (lambda r: r.rps)
        va, vb = [metric(r) for r in a], [metric(r) for r in b]
        rows.append(Row(f"{what}, {conns} conn", med(va), med(vb), "GB/s" if gbps else "req/s", True, target,
                        f"{spread(va, vb)}; p50 {med([r.p50_ms for r in a]):.2f}/{med([r.p50_ms for r in b]):.2f} ms",
                        sum(r.errors for r in a + b)))
        log(f"{rows[-1].what}: {rows[-1].ratio:.3f}")
    return rows


def model_stats(port: int) -> tuple[int, int]:
    stats = json.loads(http_request(port, f"/v2/models/{MODEL}/stats")[2])["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def batching_rows(load: LoadGen, on: Service, off: Service, args: argparse.Namespace, work_dir: Path) -> list[Row]:
    """16 closed-loop clients, single-row binary infer, batching on vs off; note: rows per onnxruntime run."""
    rows = []
    for seq in BATCHING_SEQS:
        arrays = inputs(1, seq)
        t_on, t_off = infer_target(on.port, arrays, work_dir), infer_target(off.port, arrays, work_dir)
        load.round(t_on, 1, CLIENTS), load.round(t_off, 1, CLIENTS)  # warm-up
        before = model_stats(on.port)
        a, b = interleaved(args.rounds, lambda t=t_on: load.round(t, args.seconds, CLIENTS),
                           lambda t=t_off: load.round(t, args.seconds, CLIENTS))
        after = model_stats(on.port)
        per_run = (after[0] - before[0]) / max(1, after[1] - before[1])
        va, vb = [r.rps for r in a], [r.rps for r in b]
        rows.append(Row(f"infer {CLIENTS} clients B=1 S={seq}, batching on vs off", med(va), med(vb), "req/s", True,
                        0.97, f"{spread(va, vb)}; p50 {med([r.p50_ms for r in a]):.2f}/"
                        f"{med([r.p50_ms for r in b]):.2f} ms; {per_run:.2f} rows/run batched",
                        sum(r.errors for r in a + b)))
        log(f"{rows[-1].what}: {rows[-1].ratio:.3f}")
    return rows


def infer_rows(load: LoadGen, posenc: Service, sess: ort.InferenceSession, args: argparse.Namespace,
               work_dir: Path) -> list[Row]:
    """One client, sequential: HTTP binary infer latency vs in-process `sess.run` (ratio = in-process/HTTP)."""
    rows = []
    for batch, seq in INFER_CASES:
        arrays = inputs(batch, seq)
        target = infer_target(posenc.port, arrays, work_dir)
        status, headers, body = http_request(posenc.port, target.path, "POST", target.body, target.headers)
        if status != 200:
            raise RuntimeError(f"infer B={batch} S={seq}: HTTP {status} {body[:300]!r}")
        expected = sess.run(["output"], arrays)[0]
        np.testing.assert_allclose(decode_output(body, headers), expected, atol=1e-5, rtol=1e-5)
        slice_s = max(1, args.seconds // 2)
        a, b = interleaved(args.rounds, lambda t=target, s=slice_s: load.round(t, s, 1),
                           lambda x=arrays, s=slice_s: timed_ms(lambda: sess.run(["output"], x), s))
        va = [r.p50_ms for r in a]
        rows.append(Row(f"HTTP binary infer vs in-process onnxruntime B={batch} S={seq}", med(va), med(b), "ms",
                        False, None, f"{spread(va, b, False)}; ratio = onnxruntime's share of the HTTP latency",
                        sum(r.errors for r in a)))
        log(f"{rows[-1].what}: {rows[-1].ratio:.3f}")
    return rows


def torch_module() -> tuple[Any, Any] | None:
    """(torch, RopeAttention module with rope_attention's config.json geometry), or None without torch."""
    try:
        import torch

        from models.rope import make_rope_parameters
        from models.rope_attention import RopeAttention
    except ImportError:
        return None
    rope = make_rope_parameters(head_dim=CONFIG["rope"]["head_dim"], rope_theta=CONFIG["rope"]["rope_theta"],
                                max_position_embeddings=CONFIG["max_position"])
    return torch, RopeAttention(rope, HQ, HKV, causal=CONFIG["causal"]).eval()


def ort_rows(sess: ort.InferenceSession, args: argparse.Namespace) -> list[Row]:
    """onnxruntime vs torch eager, both with one thread per core (ratio = torch ms / ort ms; the note adds torch
    on one thread, measured in the same rounds: OpenMP barriers suffer on a loaded machine), then onnxruntime
    ms per row for each batch size (every B in every round)."""
    rows = []
    slice_s = args.seconds / 4
    cores = len(os.sched_getaffinity(0))
    found = torch_module()
    if found is None:
        log("torch is not installed: skipping the onnxruntime vs torch eager rows")
    for batch, seq in INFER_CASES if found else ():
        torch, module = found  # type: ignore[misc]
        arrays = inputs(batch, seq)
        tensors = [torch.from_numpy(arrays[k]) for k in ("query", "key", "value", "position_ids")]

        def eager(threads: int, module: Any = module, tensors: list[Any] = tensors, torch: Any = torch) -> float:
            def call() -> Any:
                with torch.no_grad():
                    return module(*tensors)
            torch.set_num_threads(threads)
            return timed_ms(call, slice_s, min_calls=2)

        with torch.no_grad():
            np.testing.assert_allclose(module(*tensors).numpy(), sess.run(["output"], arrays)[0], atol=1e-4,
                                       rtol=1e-4)
        a, b, one = interleaved(args.rounds,
                                lambda x=arrays: timed_ms(lambda: sess.run(["output"], x), slice_s, min_calls=2),
                                lambda f=eager: f(cores), lambda f=eager: f(1))
        rows.append(Row(f"onnxruntime vs torch eager B={batch} S={seq}", med(a), med(b), "ms", False, None,
                        f"{spread(a, b, False)}; torch {torch.__version__}, {cores} threads; on 1 thread "
                        f"{med(one):.3g} ms"))
        log(f"{rows[-1].what}: {rows[-1].ratio:.3f}")
    for seq in PER_ROW_SEQS:
        cases = [inputs(batch, seq) for batch in PER_ROW_BATCHES]
        for arrays in cases:
            sess.run(["output"], arrays)  # warm-up
        per_call = interleaved(args.rounds, *(lambda x=arrays: timed_ms(lambda: sess.run(["output"], x),
                                                                        args.seconds / 8) for arrays in cases))
        per_row = [[ms / batch for ms in calls] for batch, calls in zip(PER_ROW_BATCHES, per_call, strict=True)]
        for batch, values in zip(PER_ROW_BATCHES, per_row, strict=True):
            rows.append(Row(f"onnxruntime per row B={batch} S={seq} (anchor: B=1)", med(values), med(per_row[0]),
                            "ms/row", False, None, "ratio = per-row speed-up over B=1"))
        log(f"onnxruntime per-row cost S={seq} done")
    return rows


def settings_lines(load: LoadGen, args: argparse.Namespace) -> list[str]:
    from service.settings import Settings

    fields = Settings.model_fields
    shown = ", ".join(f"{k}={fields[k].default}" for k in ("access_log", "log_level", "cache_bytes",
                                                          "max_table_bytes", "intra_op_num_threads",
                                                          "inference_threads", "batching", "max_queue_delay_us"))
    return [f"# posenc: {sys.executable} -m service.cli serve, POSENC_* unset (defaults: {shown}; "
            f"{MODEL} max_batch_size={CONFIG['max_batch_size']}); uvloop + httptools",
            "# posenc batching off: the same with POSENC_BATCHING=false",
            "# anchor: bare FastAPI async def endpoints on uvicorn --loop uvloop --http httptools --no-access-log, "
            "same bytes, media type and headers",
            f"# load: {load.describe()}; {CLIENTS} connections for req/s rows, {args.large_connections} for the "
            "64 MiB row, 1 for latency rows",
            f"# rounds: {args.rounds} x {args.seconds} s per side, interleaved (latency rows "
            f"{max(1, args.seconds // 2)} s); value = median of rounds; ratio oriented higher = better for posenc",
            "# rows 'X vs Y': X in the posenc column, Y in the anchor column"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=int, default=2, help="seconds per round and side (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per side (default 5)")
    parser.add_argument("--only", default=",".join(GROUPS), help=f"comma list of row groups: {','.join(GROUPS)}")
    parser.add_argument("--check", action="store_true", help="exit 1 if any ratio is below its target")
    parser.add_argument("--large-connections", type=int, default=CLIENTS, help="connections for the 64 MiB row")
    parser.add_argument("--no-wrk", action="store_true", help="use the Python load generator even if wrk exists")
    args = parser.parse_args(argv)
    args.groups = {g.strip() for g in args.only.split(",") if g.strip()}
    if not args.groups or args.groups - set(GROUPS):
        parser.error(f"--only takes a comma list of {', '.join(GROUPS)}")
    if args.seconds < 1 or args.rounds < 1:
        parser.error("--seconds and --rounds must be at least 1")
    return args


def run(args: argparse.Namespace, work_dir: Path) -> list[Row]:
    groups: set[str] = args.groups
    load = LoadGen(work_dir, prefer_wrk=not args.no_wrk)
    print("\n".join(machine_header() + settings_lines(load, args)), flush=True)
    services: list[Service] = []
    try:
        posenc = off = anchor = None
        if groups & {"small", "healthz", "large", "batching", "infer"}:
            posenc = posenc_service("posenc", {}, work_dir)
            services.append(posenc)
        if "batching" in groups:
            off = posenc_service("posenc-batching-off", {"batching": "false"}, work_dir)
            services.append(off)
        for service in services:
            service.wait_ready("/readyz")
        rows: list[Row] = []
        if posenc and groups & {"small", "healthz", "large"}:
            spec_path, cache_note = capture_tables(posenc, work_dir)
            print(f"# tables: {cache_note}", flush=True)
            anchor = anchor_service(spec_path, work_dir, work_dir)
            services.append(anchor)
            anchor.wait_ready("/healthz")
            rows += http_rows(groups, load, posenc, anchor, args)
        if posenc and off:
            rows += batching_rows(load, posenc, off, args, work_dir)
        sess = session() if groups & {"infer", "ort"} else None
        if posenc and sess and "infer" in groups:
            rows += infer_rows(load, posenc, sess, args, work_dir)
        if sess and "ort" in groups:
            rows += ort_rows(sess, args)
        return rows
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not leave servers behind
            signal.signal(sig, signal.SIG_IGN)
        stop_all(services)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through `finally`: servers are stopped
    args = parse_args(argv)
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="posenc-ratios-") as tmp:
            rows = run(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted: every server was stopped", file=sys.stderr)
        return 130
    print("\n" + format_table(rows))
    print(f"\n# {time.monotonic() - started:.0f} s in all", flush=True)
    failing = [r for r in rows if r.status in ("BELOW", "ERROR")]
    return 1 if args.check and failing else 0


if __name__ == "__main__":
    raise SystemExit(main())
