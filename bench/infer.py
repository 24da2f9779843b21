"""Inference benchmark: onnxruntime in-process vs torch eager vs HTTP (binary, JSON); batching on vs off.

    python bench/infer.py            # full run (a few minutes on 2 cores)
    python bench/infer.py --quick    # fewer repetitions

Latency rows: median milliseconds per call for one (B, Hq/Hkv, S, D) request, all four measured in
this run on the shipped models. The HTTP columns go through a `posenc` server started in a
subprocess on loopback and `tritonclient.http` (binary tensors in and out, or JSON in and out).
Throughput rows: requests/second of many concurrent clients each sending single-row requests, with
the server's dynamic batching on and off. Needs the test extra (torch, tritonclient).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.export_onnx import default_specs  # noqa: E402

# (model, B, S): the shipped models fix Hq/Hkv/D (rope_attention 8/8/64, llama3_1_attention 32/8/128).
LATENCY_CASES = [("rope_attention", 1, 128), ("rope_attention", 4, 256), ("llama3_1_attention", 1, 128),
                 ("llama3_1_attention", 1, 512)]
THROUGHPUT_CASES = [("rope_attention", 1, 16), ("rope_attention", 1, 256)]


def _inputs(hq: int, hkv: int, dim: int, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "query": rng.standard_normal((batch, hq, seq, dim), dtype=np.float32),
        "key": rng.standard_normal((batch, hkv, seq, dim), dtype=np.float32),
        "value": rng.standard_normal((batch, hkv, seq, dim), dtype=np.float32),
        "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),  # [B, S]
    }


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`posenc` in a subprocess on loopback (uvicorn, one worker) with the given POSENC_* settings."""

    def __init__(self, **settings: str) -> None:
        self.port = _free_port()
        env = {**os.environ, **{f"POSENC_{k.upper()}": v for k, v in settings.items()}, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "service.app:app_from_env", "--factory", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
            cwd=ROOT, env=env,
        )
        self.url = f"127.0.0.1:{self.port}"
        client = httpclient.InferenceServerClient(self.url)
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:  # not listening yet
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("posenc server did not become ready")
            time.sleep(0.2)
        client.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _triton_call(client: httpclient.InferenceServerClient, model: str, inputs: dict[str, np.ndarray],
                 binary: bool) -> Callable[[], np.ndarray]:
    def call() -> np.ndarray:
        tensors = []
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
            tensor.set_data_from_numpy(array, binary_data=binary)
            tensors.append(tensor)
        outputs = [httpclient.InferRequestedOutput("output", binary_data=binary)]
        return client.infer(model, tensors, outputs=outputs).as_numpy("output")
    return call


def latency_table(repeat: int, threads: int) -> list[str]:
    specs = {spec.name: spec for spec in default_specs()}
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    sessions = {name: ort.InferenceSession(str(ROOT / "onnx" / name / "model.onnx"), sess_options=options,
                                           providers=["CPUExecutionProvider"]) for name in specs}
    torch.set_num_threads(threads)
    server = Server(intra_op_num_threads=str(threads), max_queue_delay_us="0")
    client = httpclient.InferenceServerClient(server.url, connection_timeout=300, network_timeout=300)
    rows = ["| model | B | Hq/Hkv | S | D | onnxruntime in-process | torch eager | HTTP binary | HTTP JSON |",
            "|---|---|---|---|---|---|---|---|---|"]
    try:
        for model, batch, seq in LATENCY_CASES:
            spec = specs[model]
            inputs = _inputs(spec.num_heads, spec.num_kv_heads, spec.rope.head_dim, batch, seq)
            module = spec.module()
            tensors = [torch.from_numpy(inputs[k]) for k in ("query", "key", "value", "position_ids")]

            def torch_call(module: torch.nn.Module = module, tensors: list = tensors) -> object:
                with torch.no_grad():
                    return module(*tensors)

            sess = sessions[model]
            ort_ms = _median_ms(lambda sess=sess, inputs=inputs: sess.run(["output"], inputs), repeat)
            torch_ms = _median_ms(torch_call, repeat)
            binary_ms = _median_ms(_triton_call(client, model, inputs, True), repeat)
            try:
                json_ms = f"{_median_ms(_triton_call(client, model, inputs, False), max(2, repeat // 5)):.2f} ms"
            except InferenceServerException as exc:  # JSON text of big tensors can exceed the body limit
                json_ms = f"HTTP {exc.status()}"
            rows.append(f"| {model} | {batch} | {spec.num_heads}/{spec.num_kv_heads} | {seq} | {spec.rope.head_dim} "
                        f"| {ort_ms:.2f} ms | {torch_ms:.2f} ms | {binary_ms:.2f} ms | {json_ms} |")
            print(rows[-1], flush=True)
    finally:
        client.close()
        server.stop()
    return rows


def _throughput(case: tuple[str, int, int], batching: bool, clients: int, per_client: int,
                threads: int) -> tuple[float, float, float]:
    model, batch, seq = case
    spec = {s.name: s for s in default_specs()}[model]
    inputs = _inputs(spec.num_heads, spec.num_kv_heads, spec.rope.head_dim, batch, seq)
    server = Server(batching=str(batching).lower(), intra_op_num_threads=str(threads), max_queue_delay_us="1000",
                    max_batch_size="16", inference_threads="4")
    latencies: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        client = httpclient.InferenceServerClient(server.url, connection_timeout=120, network_timeout=120)
        call = _triton_call(client, model, inputs, True)
        call()  # warm-up connection
        for _ in range(per_client):
            start = time.perf_counter()
            call()
            with lock:
                latencies.append(time.perf_counter() - start)
        client.close()

    try:
        stats_client = httpclient.InferenceServerClient(server.url)
        workers = [threading.Thread(target=worker) for _ in range(clients)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        stats = stats_client.get_inference_statistics(model)["model_stats"][0]
        stats_client.close()
    finally:
        server.stop()
    rows_per_run = stats["inference_count"] / max(1, stats["execution_count"])
    return clients * per_client / elapsed, 1000 * statistics.median(latencies), rows_per_run


def throughput_table(clients: int, per_client: int, threads: int) -> list[str]:
    rows = [f"| {clients} concurrent clients, single requests | batching | requests/s | median latency "
            "| mean rows per onnxruntime run |", "|---|---|---|---|---|"]
    for case in THROUGHPUT_CASES:
        model, batch, seq = case
        for batching in (True, False):
            rps, p50, rows_per_run = _throughput(case, batching, clients, per_client, threads)
            rows.append(f"| {model} B={batch} S={seq} | {'on' if batching else 'off'} | {rps:.0f} | {p50:.2f} ms "
                        f"| {rows_per_run:.1f} |")
            print(rows[-1], flush=True)
    return rows


def main() -> int:
    # A terminated benchmark still stops its server subprocesses (the `finally` blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="intra-op threads everywhere")
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    repeat = 5 if args.quick else 20
    per_client = 20 if args.quick else 60
    print(f"# onnxruntime {ort.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs, "
          f"{args.threads} intra-op threads", flush=True)
    latency = latency_table(repeat, args.threads)
    throughput = throughput_table(args.clients, per_client, args.threads)
    print("\n" + "\n".join(latency) + "\n\n" + "\n".join(throughput))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
