"""Inference benchmark: the transport anchor, HTTP binary, HTTP shared memory, in-process onnxruntime, torch eager.

    python bench/infer.py                      # CPU, small cases (about a minute on 2 cores)
    python bench/infer.py --device cuda        # every column on the GPU (fails at once without CUDA)
    python bench/infer.py --throughput         # also requests/s of many clients, batching on and off (CPU)

Latency rows: median milliseconds per call for one (B, S) request on the shipped models, every column
measured side by side in this run, on one device:
* echo: a bare ASGI endpoint in the same server process and uvicorn config that reads the N bytes of the
  binary infer request and answers the M bytes of its response (bench/echo_asgi.py): the transport alone;
* HTTP binary: the KServe v2 binary request (built once by tritonclient) posted with the same HTTP client,
  the response's output decoded with np.frombuffer;
* HTTP shm: the same request with inputs and output in registered system shared memory (tritonclient's
  utilities; the inputs are written into the region once, outside the timing, as Triton's perf_analyzer does);
* onnxruntime in-process with numpy in/out (and, with --device cuda, with I/O binding: inputs and output as
  OrtValues on the device, bound once);
* torch eager (the module the models were exported from).
Ratios: overhead = (HTTP binary − onnxruntime) / echo (target ≤ 1.3), and shm = onnxruntime / HTTP shm
(target ≥ 0.9), both where B·S ≥ 4096: below that a request's fixed cost (routing, parsing, the hop to an
inference thread: about 2 ms on a 2-vCPU VM) outweighs its bytes and its run. Needs the test extra (torch,
tritonclient).
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from geventhttpclient import HTTPClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from models.dtypes import lookup  # noqa: E402
from models.export_onnx import default_specs  # noqa: E402
from tests.infer_utils import triton_inputs  # noqa: E402

MiB = 1024 * 1024
# (model, B, S): the shipped models fix Hq/Hkv/D (rope_attention 8/8/64, llama3_1_attention 32/8/128).
CASES = {
    "cpu": [("rope_attention", 1, 128), ("rope_attention", 4, 256), ("rope_attention", 8, 512),
            ("llama3_1_attention", 1, 512)],
    "cuda": [("rope_attention", 4, 512), ("rope_attention", 8, 2048), ("llama3_1_attention", 8, 2048)],
}
THROUGHPUT_CASES = [("rope_attention", 1, 16), ("rope_attention", 1, 256)]
CUDA = "CUDAExecutionProvider"


def _inputs(hq: int, hkv: int, dim: int, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "query": rng.standard_normal((batch, hq, seq, dim), dtype=np.float32),
        "key": rng.standard_normal((batch, hkv, seq, dim), dtype=np.float32),
        "value": rng.standard_normal((batch, hkv, seq, dim), dtype=np.float32),
        "position_ids": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),  # [B, S]
    }


def _side_by_side(calls: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median milliseconds of each call; the columns take turns in every round (a busy moment of the machine
    hits all of them, not one)."""
    for call in calls.values():
        call()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(values) for name, values in times.items()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def describe_machine(device: str) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU") \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    parts = [f"{cpu}, {len(os.sched_getaffinity(0))} usable CPUs", f"Python {platform.python_version()}",
             f"onnxruntime {ort.__version__}", f"torch {torch.__version__}", f"device {device}"]
    if device == "cuda":
        parts.append(f"GPU {torch.cuda.get_device_name(0)}")
    return "# " + "; ".join(parts)


def require_cuda() -> None:
    """--device cuda: onnxruntime-gpu with a CUDA provider and a CUDA device for torch, or a clear exit."""
    problems = []
    if CUDA not in ort.get_available_providers():
        problems.append(f"onnxruntime {ort.__version__} has no {CUDA} (install onnxruntime-gpu)")
    if not torch.cuda.is_available():
        problems.append("torch sees no CUDA device")
    if problems:
        raise SystemExit("--device cuda: " + "; ".join(problems))


class Server:
    """posenc + the echo (bench/echo_asgi.py) in a uvicorn subprocess on loopback, with POSENC_* settings."""

    def __init__(self, **settings: str) -> None:
        self.port = _free_port()
        env = {**os.environ, **{f"POSENC_{k.upper()}": v for k, v in settings.items()}, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "bench.echo_asgi:posenc_with_echo", "--factory", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
            cwd=ROOT, env=env,
        )
        self.url = f"127.0.0.1:{self.port}"
        client = httpclient.InferenceServerClient(self.url)
        deadline = time.monotonic() + 120
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


class Raw:
    """One keep-alive connection posting prepared bodies (the HTTP client tritonclient itself uses)."""

    def __init__(self, url: str) -> None:
        host, port = url.rsplit(":", 1)
        self.client = HTTPClient(host, int(port), connection_timeout=300, network_timeout=300, concurrency=1)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, Any]:
        response = self.client.post(path, body=body, headers=headers)
        data = response.read()
        if response.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {response.status_code}: {data[:300]!r}")
        return data, response

    def close(self) -> None:
        self.client.close()


def _binary_call(raw: Raw, model: str, inputs: dict[str, np.ndarray]) -> tuple[Callable[[], np.ndarray], int, int]:
    """(call, request bytes, response bytes): post the binary request, decode the output."""
    body, json_size = httpclient.InferenceServerClient.generate_request_body(
        triton_inputs(inputs, binary=True), outputs=[httpclient.InferRequestedOutput("output", binary_data=True)])
    headers = {"Inference-Header-Content-Length": str(json_size)}
    path = f"/v2/models/{model}/infer"

    def call() -> np.ndarray:
        data, response = raw.post(path, body, headers)
        start = int(response.get("inference-header-content-length"))
        return np.frombuffer(data, dtype=np.float32, offset=start)
    response_bytes = len(raw.post(path, body, headers)[0])
    return call, len(body), response_bytes


class SharedMemoryCase:
    """Inputs and output of one case in two registered system shared-memory regions."""

    def __init__(self, client: httpclient.InferenceServerClient, inputs: dict[str, np.ndarray], tag: str) -> None:
        self.client, self.tag = client, tag
        self.in_size = sum(array.nbytes for array in inputs.values())
        self.out_size = inputs["query"].nbytes
        self.regions = [(f"in_{tag}", f"/posenc_bench_in_{os.getpid()}_{tag}", self.in_size),
                        (f"out_{tag}", f"/posenc_bench_out_{os.getpid()}_{tag}", self.out_size)]
        self.handles = [shm.create_shared_memory_region(name, key, size) for name, key, size in self.regions]
        shm.set_shared_memory_region(self.handles[0], list(inputs.values()))
        for name, key, size in self.regions:
            client.register_system_shared_memory(name, key, size)
        self.tensors, offset = [], 0
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), lookup(array.dtype).kserve)
            tensor.set_shared_memory(f"in_{tag}", array.nbytes, offset=offset)
            self.tensors.append(tensor)
            offset += array.nbytes
        self.shape = list(inputs["query"].shape)

    def call(self, raw: Raw, model: str) -> Callable[[], np.ndarray]:
        output = httpclient.InferRequestedOutput("output")
        output.set_shared_memory(f"out_{self.tag}", self.out_size)
        body, _ = httpclient.InferenceServerClient.generate_request_body(self.tensors, outputs=[output])
        path = f"/v2/models/{model}/infer"

        def call() -> np.ndarray:
            raw.post(path, body, {})
            return shm.get_contents_as_numpy(self.handles[1], np.float32, self.shape)  # a view, no copy
        return call

    def close(self) -> None:
        for name, _, _ in self.regions:
            self.client.unregister_system_shared_memory(name)
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


def _session(model: str, device: str, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the server's sessions
    providers = [CUDA, "CPUExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(ROOT / "onnx" / model / "model.onnx"), sess_options=options, providers=providers)
    if device == "cuda" and session.get_providers()[0] != CUDA:
        raise SystemExit(f"--device cuda: onnxruntime did not put {model} on {CUDA}: {session.get_providers()}")
    return session


def _io_binding_call(session: ort.InferenceSession, inputs: dict[str, np.ndarray]) -> Callable[[], object]:
    """onnxruntime with inputs and output as OrtValues on the GPU, bound once (no host copies per call)."""
    binding = session.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0) for name, array in inputs.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    output = ort.OrtValue.ortvalue_from_shape_and_type(list(inputs["query"].shape), np.float32, "cuda", 0)
    binding.bind_ortvalue_output("output", output)

    def call() -> object:
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return output
    return call


def _torch_call(model: str, inputs: dict[str, np.ndarray], device: str) -> Callable[[], object]:
    spec = {s.name: s for s in default_specs()}[model]
    module = spec.module().to(device).eval()
    tensors = [torch.from_numpy(inputs[k]).to(device) for k in ("query", "key", "value", "position_ids")]

    def call() -> object:
        with torch.no_grad():
            out = module(*tensors)
        if device == "cuda":
            torch.cuda.synchronize()
        return out
    return call


def latency_table(device: str, repeat: int, threads: int, cases: list[tuple[str, int, int]]) -> list[str]:
    specs = {spec.name: spec for spec in default_specs()}
    all_inputs = {case: _inputs(specs[case[0]].num_heads, specs[case[0]].num_kv_heads, specs[case[0]].rope.head_dim,
                                case[1], case[2]) for case in cases}
    largest = max(sum(a.nbytes for a in inputs.values()) for inputs in all_inputs.values())
    server = Server(intra_op_num_threads=str(threads), max_queue_delay_us="0", shared_memory="true",
                    providers=device, access_log="false", max_request_bytes=str(largest + MiB),
                    memory_budget_bytes=str(max(1024 * MiB, 4 * largest)))
    client = httpclient.InferenceServerClient(server.url, connection_timeout=300, network_timeout=300)
    raw = Raw(server.url)
    torch.set_num_threads(threads)
    binding_column = device == "cuda"
    rows = ["| model | B | S | in / out MB | echo | HTTP binary | HTTP shm | onnxruntime"
            + (" | onnxruntime I/O binding" if binding_column else "")
            + " | torch eager | overhead / echo (≤ 1.3 at B·S ≥ 4096) | onnxruntime / shm (≥ 0.9 at B·S ≥ 4096) |",
            "|---" * (11 + binding_column) + "|"]
    try:
        for index, (model, batch, seq) in enumerate(cases):
            inputs = all_inputs[(model, batch, seq)]
            session = _session(model, device, threads)
            expected = session.run(["output"], inputs)[0]
            binary, request_bytes, response_bytes = _binary_call(raw, model, inputs)
            np.testing.assert_allclose(binary().reshape(expected.shape), expected, atol=1e-4, rtol=1e-4)
            echo_body, echo_headers = bytes(request_bytes), {"X-Echo-Bytes": str(response_bytes)}
            shared = SharedMemoryCase(client, inputs, str(index))
            try:
                calls: dict[str, Callable[[], object]] = {
                    "echo": lambda body=echo_body, headers=echo_headers: raw.post("/bench/echo", body, headers),
                    "binary": binary,
                    "shm": shared.call(raw, model),
                    "ort": lambda session=session, inputs=inputs: session.run(["output"], inputs),
                    "torch": _torch_call(model, inputs, device),
                }
                if binding_column:
                    calls["binding"] = _io_binding_call(session, inputs)
                np.testing.assert_allclose(calls["shm"](), expected, atol=1e-4, rtol=1e-4)  # type: ignore[arg-type]
                times = _side_by_side(calls, repeat)
            finally:
                shared.close()
            overhead = (times["binary"] - times["ort"]) / times["echo"]
            shm_ratio = times["ort"] / times["shm"]
            target = "" if batch * seq >= 4096 else " (n/a)"
            rows.append(f"| {model} | {batch} | {seq} | {request_bytes / 1e6:.1f} / {response_bytes / 1e6:.1f} "
                        f"| {times['echo']:.2f} ms | {times['binary']:.2f} ms | {times['shm']:.2f} ms "
                        f"| {times['ort']:.2f} ms" + (f" | {times['binding']:.2f} ms" if binding_column else "")
                        + f" | {times['torch']:.2f} ms | {overhead:.2f}{target} | {shm_ratio:.2f}{target} |")
            print(rows[-1], flush=True)
    finally:
        raw.close()
        client.close()
        server.stop()
    return rows


def _throughput(case: tuple[str, int, int], batching: bool, clients: int, per_client: int,
                threads: int) -> tuple[float, float, float]:
    model, batch, seq = case
    spec = {s.name: s for s in default_specs()}[model]
    inputs = _inputs(spec.num_heads, spec.num_kv_heads, spec.rope.head_dim, batch, seq)
    server = Server(batching=str(batching).lower(), intra_op_num_threads=str(threads), max_queue_delay_us="1000",
                    max_batch_size="16", inference_threads="4", providers="cpu", access_log="false")
    latencies: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        raw = Raw(server.url)
        call, _, _ = _binary_call(raw, model, inputs)  # also warms the connection up
        for _ in range(per_client):
            start = time.perf_counter()
            call()
            with lock:
                latencies.append(time.perf_counter() - start)
        raw.close()

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
    rows = [f"| {clients} concurrent clients, single requests (CPU) | batching | requests/s | median latency "
            "| mean rows per onnxruntime run |", "|---|---|---|---|---|"]
    for case in THROUGHPUT_CASES:
        model, batch, seq = case
        for batching in (True, False):
            rps, p50, rows_per_run = _throughput(case, batching, clients, per_client, threads)
            rows.append(f"| {model} B={batch} S={seq} | {'on' if batching else 'off'} | {rps:.0f} | {p50:.2f} ms "
                        f"| {rows_per_run:.1f} |")
            print(rows[-1], flush=True)
    return rows


def _case(text: str) -> tuple[str, int, int]:
    model, batch, seq = text.split(":")
    return model, int(batch), int(seq)


def main() -> int:
    # A terminated benchmark still stops its server subprocesses (the `finally` blocks run).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where every column runs: the server (POSENC_PROVIDERS), onnxruntime and torch")
    parser.add_argument("--case", type=_case, action="append", metavar="MODEL:B:S",
                        help="a latency case (repeatable); default: a small set per device")
    parser.add_argument("--repeat", type=int, default=9, help="timed calls per column (median reported)")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="intra-op threads")
    parser.add_argument("--throughput", action="store_true", help="also the concurrent-clients table (CPU)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-client", type=int, default=20)
    args = parser.parse_args()
    if args.device == "cuda":
        require_cuda()
    print(describe_machine(args.device), flush=True)
    tables = [latency_table(args.device, args.repeat, args.threads, args.case or CASES[args.device])]
    if args.throughput:
        tables.append(throughput_table(args.clients, args.per_client, args.threads))
    print("\n" + "\n\n".join("\n".join(rows) for rows in tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
