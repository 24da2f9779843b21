"""infer: one KServe v2 request over HTTP, side by side with the transport alone, shared memory, in-process
onnxruntime and torch eager.

    python -m bench infer                          # CPU, 5 cases (about two minutes on 2 cores)
    python -m bench infer --device cuda            # every column on the GPU (fails at once without CUDA)
    python -m bench infer --case rope_attention:8:512 --repeat 20
    python -m bench infer --quick --pytriton --litserve   # the peers even with --quick (their environments made once)

Latency table: median milliseconds per call for one (B, S) request on the shipped models, every column measured
side by side in this run (each column once per round, the order reversed every other round), on one device:
* echo: a bare ASGI endpoint in the same server process, run by posenc's own server (protocol, body reading),
  that reads the N bytes of the binary infer request and answers the M bytes of its response
  (bench/echo_asgi.py): the transport alone;
* HTTP binary: the KServe v2 binary request (built once by the test kit) posted with geventhttpclient (the
  HTTP client tritonclient uses), the output decoded with np.frombuffer (the kit's decoder);
* HTTP shm zero-copy: the same request with inputs and output in two sealed memfds registered as `fd:N` over
  `posenc serve`'s Unix socket (the server maps them: inputs are views, the output is written in place);
  the inputs are written once, outside the timing, as Triton's perf_analyzer does;
* HTTP shm copied: the same with /dev/shm objects (tritonclient's shared-memory utilities) over TCP with the
  restricted-API key: objects that may shrink are read with pread before the run and written with pwrite;
* onnxruntime in-process with numpy in/out (and, with --device cuda, with I/O binding: inputs and output as
  OrtValues on the device, bound once);
* torch eager (the module the models were exported from), when torch is installed;
* gRPC raw and gRPC tritonclient: the same request over the server's gRPC service, and tritonclient's over the
  gRPC echo (its client and the transport alone: bench/grpc_columns.py).
* KServe's ModelServer, NVIDIA PyTriton (HTTP and gRPC) and LitServe (HTTP), on the CPU: the same graph served by
  each in its own virtual environment (bench/peers.py), at 1 client (columns measured with the rest) and 8 clients
  (req/s, rounds of their own); their table and the ratios posenc / peer per protocol: bench/peer_columns.py.
* onnxruntime as a user runs it in-process: a session with onnxruntime's default options (the server picks its
  own, by measurement: see docs/performance.md), on the graph the server runs for the case (on the CPU, the
  model's CPU form from the sequence length its export measured it faster: bench/inprocess.py `model_file`).
Ratios and their targets, by B·S (`targets`): overhead = (HTTP binary − onnxruntime) / echo ≤ 1.3 for small
(B·S ≤ 128) and large (B·S ≥ 4096) requests; shm = onnxruntime / HTTP shm zero-copy ≥ 0.6 small, ≥ 0.9 large;
onnxruntime / HTTP binary ≥ 0.5 (half the in-process throughput) in between (B·S ≥ 1024); torch eager /
onnxruntime ≥ 1.0 at every case (the ONNX path is to be the fast one; llama3_1_attention B=1 S=1024, where
torch's fused CPU attention comes closest, is among the CPU cases). The ratio table also gets the copied shared
memory (informational). With --device cuda: onnxruntime with I/O binding / HTTP shm zero-copy ≥ 0.8 at
B·S ≥ 16384 (the server's copies to and from the pinned regions against a run whose tensors are on the device).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import ExitStack, closing
from functools import partial
from typing import Any

import numpy as np

from bench import grpc_columns
from bench.clients import Raw
from bench.echo_asgi import ANSWER_HEADER, ECHO_PATH
from bench.harness import Bench, Report, Row, inputs, interleaved, log, med, spread
from bench.inprocess import require_cuda, torch_version
from bench.isolation import AnchorProcess, alone, burst_ms
from bench.peer_columns import ROUNDS as PEER_ROUNDS
from bench.peer_columns import PeerColumns
from bench.peers import LITSERVE, PYTRITON, kserve_python, start_kserve
from bench.profile import HEADER, NOTE, SocketEcho, median_phases, profile_row
from bench.shm_columns import SharedMemoryCase, ZeroCopyCase
from posenc.service.request_kit import phases
from posenc.service.testing import (
    RequestedOutput,
    decode_response,
    kserve_request,
    shared_memory_key_settings,
)

MiB = 1024 * 1024
# (model, B, S): the shipped models fix Hq/Hkv/D (rope_attention 8/8/64, llama3_1_attention 32/8/128).
CASES = {
    "cpu": [("rope_attention", 1, 128), ("rope_attention", 4, 256), ("rope_attention", 8, 512),
            ("llama3_1_attention", 1, 512), ("llama3_1_attention", 1, 1024)],
    "cuda": [("rope_attention", 4, 512), ("rope_attention", 8, 2048), ("llama3_1_attention", 8, 2048)],
}
QUICK_CASES, QUICK_REPEAT = 3, 5  # --quick: the first cases of the device, rounds per column
TARGET_ROWS = 4096  # B·S from which the large-request targets hold
SMALL_ROWS = 128  # B·S up to which a request is small: its fixed cost is what is measured
MID_ROWS = 1024  # B·S from which (below TARGET_ROWS) HTTP binary is held to a share of onnxruntime's throughput
OVERHEAD_TARGET = 1.3  # (HTTP binary - onnxruntime) / echo, at most: small and large requests
SHM_TARGET, SMALL_SHM_TARGET = 0.9, 0.6  # onnxruntime / HTTP shm zero-copy: large, small requests
BINARY_TARGET = 0.5  # onnxruntime / HTTP binary for mid-size requests
TORCH_TARGET = 1.0  # torch eager / onnxruntime, at every shape: the ONNX path is to be the fast one
KSERVE_TARGET = 1.0  # KServe ModelServer / posenc, HTTP binary: posenc ahead at every shape
GPU_SHM_ROWS, GPU_SHM_TARGET = 16384, 0.8  # --device cuda: onnxruntime I/O binding / HTTP shm zero-copy from B·S
BURST_MS, QUICK_BURST_MS, MOST_CALLS = 600.0, 250.0, 5  # a side's burst per round: its calls fit this, 1 to 5


def targets(batch: int, seq: int) -> dict[str, float]:
    """The targets that hold for a case, by B·S: "overhead", "shm", "binary"."""
    rows = batch * seq
    if rows >= TARGET_ROWS:
        return {"overhead": OVERHEAD_TARGET, "shm": SHM_TARGET}
    if rows <= SMALL_ROWS:
        return {"overhead": OVERHEAD_TARGET, "shm": SMALL_SHM_TARGET}
    return {"binary": BINARY_TARGET} if rows >= MID_ROWS else {}


def parse_case(text: str) -> tuple[str, int, int]:
    """`MODEL:B:S` of --case."""
    model, batch, seq = text.split(":")
    return model, int(batch), int(seq)


def binary_call(raw: Raw, model: str,
                arrays: dict[str, np.ndarray]) -> tuple[Callable[[], np.ndarray], int, int, Callable[[], str | None]]:
    """(call, request bytes, response bytes, timing): post the binary request, decode the output; `timing` posts
    it and answers its Server-Timing header."""
    request = kserve_request(arrays, outputs=[RequestedOutput("output", binary=True)])
    path = f"/v2/models/{model}/infer"

    def call() -> np.ndarray:
        return decode_response(*raw.post(path, request.body, request.headers)).outputs["output"]

    def timing() -> str | None:
        return raw.post(path, request.body, request.headers)[1].get(phases.HEADER.lower())
    return call, len(request.body), len(raw.post(path, request.body, request.headers)[0]), timing


def measured(sides: dict[str, Callable[[int], list[float]]], rounds: int, budget_ms: float,
             most: int) -> dict[str, list[float]]:
    """Per side, the median milliseconds of its burst in each of `rounds` interleaved rounds. A side runs alone:
    a pause before it (bench/isolation.py), then a burst of consecutive calls (after one untimed call), as many
    as fit `budget_ms` by its first call, 1 to `most`."""
    calls = {}
    for name, burst in sides.items():
        first = burst(1)[0]
        calls[name] = max(1, min(most, int(budget_ms / max(first, 1e-3))))
    rounds_ms = interleaved(rounds, *(alone(partial(burst, calls[name])) for name, burst in sides.items()))
    return dict(zip(sides, rounds_ms, strict=True))


def case_rows(model: str, batch: int, seq: int, times: dict[str, list[float]], threads: int) -> list[Row]:
    """The ratio-table rows of one case: informational, plus the targets that hold at its B·S (`targets`); the
    control of each is the two identical onnxruntime anchors' ratio in the same rounds."""
    where = f"{model} B={batch} S={seq}"
    binary, ort, echo, shm, copied = times["binary"], times["ort"], times["echo"], times["shm"], times["shm copied"]
    held = targets(batch, seq)
    control = med(times["ort twin"]) / med(ort)
    rows = [Row(f"HTTP binary infer vs in-process onnxruntime {where}", med(binary), med(ort), "ms", False,
                held.get("binary"), f"{spread(binary, ort, False)}; ratio = onnxruntime's share of the HTTP latency",
                control=control)]
    if "torch" in times:
        # torch's tensors stay on the device: on the GPU it is held to the run with I/O binding, whose do too
        mine, label = (times["binding"], "onnxruntime I/O binding") if "binding" in times else (ort, "onnxruntime")
        rows.append(Row(f"{label} vs torch eager {where}", med(mine), med(times["torch"]), "ms", False, TORCH_TARGET,
                        f"{spread(mine, times['torch'], False)}; torch {torch_version()}, each alone, "
                        f"{threads} threads", control=control))
    if "kserve" in times:
        rows.append(Row(f"HTTP binary infer: posenc vs KServe ModelServer {where}", med(binary), med(times["kserve"]),
                        "ms", False, KSERVE_TARGET, f"{spread(binary, times['kserve'], False)}; the same graph, "
                        "onnxruntime and session options, the same client", control=control))
    rows.append(Row(f"HTTP shm copied (/dev/shm, TCP) vs in-process onnxruntime {where}", med(copied), med(ort), "ms",
                    False, None, f"{spread(copied, ort, False)}; objects that may shrink are read and written with "
                    "pread/pwrite"))
    rows.append(Row(f"HTTP shm zero-copy (sealed memfd, Unix socket) vs in-process onnxruntime {where}", med(shm),
                    med(ort), "ms", False, held.get("shm"), spread(shm, ort, False), control=control))
    if "binding" in times:  # on the GPU: against the run alone, inputs and output already on the device
        rows.append(Row(f"HTTP shm zero-copy vs onnxruntime I/O binding {where}", med(shm), med(times["binding"]), "ms",
                        False, GPU_SHM_TARGET if batch * seq >= GPU_SHM_ROWS else None,
                        f"{spread(shm, times['binding'], False)}; the region pinned, one DMA per tensor each way",
                        control=control))
        rows.append(Row(f"HTTP shm zero-copy: pinned vs pageable regions {where}", med(shm),
                        med(times["shm pageable"]), "ms", False, None,
                        f"{spread(shm, times['shm pageable'], False)}; POSENC_CUDA_PIN_SHARED_MEMORY true vs false"))
    rows.append(Row(f"(HTTP binary - onnxruntime) / echo {where}", med(binary) - med(ort), med(echo), "ms", True,
                    held.get("overhead"), "overhead: what posenc adds to the run, in echoes", at_most=True,
                    control=control))
    return rows


def run(bench: Bench) -> Report:
    args = bench.args
    device, threads, cores = args.device, args.threads, bench.cores
    if device == "cuda":
        require_cuda()
    quick = getattr(args, "quick", False)
    cases: list[tuple[str, int, int]] = args.case or CASES[device][:QUICK_CASES if quick else None]
    repeat = min(args.repeat, QUICK_REPEAT) if quick else args.repeat
    all_inputs = {case: inputs(case[1], case[2], case[0]) for case in cases}
    largest = max(sum(a.nbytes for a in arrays.values()) for arrays in all_inputs.values())
    binding_column, has_torch = device == "cuda", torch_version() is not None
    kserve, why_not = (None, "--no-kserve") if args.kserve is False or device == "cuda" else \
        kserve_python(create=args.kserve is True or not quick)
    notes = [f"# infer: posenc + echo (bench/echo_asgi.py) on posenc's server, device {device}, {threads} intra-op "
             "threads in every server and anchor; in-process anchors (onnxruntime with default session options but "
             "the threads, torch eager) each in its own process; the echo in a server of its own; "
             f"{repeat} rounds, every side alone in bursts; control: a second identical onnxruntime anchor; "
             f"torch {torch_version() or 'not installed: no torch column'}; "
             f"KServe ModelServer: {'on' if kserve else 'not measured: ' + why_not}"]
    if device == "cuda":
        import torch
        notes.append(f"# GPU {torch.cuda.get_device_name(0)}")
    table = ["| model | B | S | in / out MB | echo | HTTP binary | HTTP shm zero-copy | HTTP shm copied | onnxruntime"
             " | onnxruntime (control) | "
             + ("onnxruntime I/O binding | HTTP shm zero-copy, not pinned | " if binding_column else "")
             + "torch eager | KServe ModelServer | overhead / echo (≤ 1.3 at B·S ≤ 128 and ≥ 4096) "
             "| onnxruntime / shm (≥ 0.6 at B·S ≤ 128, ≥ 0.9 at B·S ≥ 4096)" + grpc_columns.HEADER + " |",
             "|---" * (14 + grpc_columns.COLUMNS + 2 * binding_column) + "|"]
    report = Report(notes=notes)
    profile: list[str] = []
    settings: dict[str, object] = {
        "intra_op_num_threads": threads, "max_queue_delay_us": 0, "shared_memory": True, "providers": device,
        **shared_memory_key_settings(), "access_log": False, "log_level": "warning",
        "server_timing": True, "max_request_bytes": largest + MiB, "memory_budget_bytes": max(1024 * MiB, 4 * largest),
        # a client's kept-alive connection waits while the other sides' rounds run (tritonclient's HTTP client does
        # not send a request again on a connection the server closed meanwhile)
        "timeout_keep_alive": 3600}
    command = [sys.executable, "-m", "bench.echo_asgi", "--host", "{host}", "--port", "{port}"]
    socket_path = str(bench.work_dir / "posenc.sock")
    anchor_names = ["ort", "ort twin", *(["torch"] if has_torch else []), *(["binding"] if binding_column else [])]
    with bench.servers() as servers, ExitStack() as stack:
        server = servers.start("posenc + echo", {**settings, **grpc_columns.server_settings()}, command=command)
        # the zero-copy column: `posenc serve` itself, whose Unix socket tells it who the client is
        servers.start("posenc serve (unix socket)", {**settings, "uds": socket_path})
        pageable_path = str(bench.work_dir / "posenc-pageable.sock")
        if binding_column:  # on the GPU, the same with the regions left pageable: what pinning them saves
            servers.start("posenc serve (unix socket, not pinned)",
                          {**settings, "uds": pageable_path, "cuda_pin_shared_memory": False})
        # the transport's anchor, a process alone (the gRPC one too)
        echo_server = servers.start("echo", settings, command=command + grpc_columns.echo_arguments())
        peer = start_kserve(servers, kserve, sorted({c[0] for c in cases}), threads) if kserve else None
        anchors = {name: stack.enter_context(AnchorProcess(name, cores.serve, threads)) for name in anchor_names}
        servers.ready("/v2/health/ready", timeout=120)
        # PyTriton and LitServe (bench/peer_columns.py), on the CPU: started once posenc's servers are ready
        peers = None if device == "cuda" else stack.enter_context(closing(PeerColumns(
            servers, cores, sorted({c[0] for c in cases}), threads,
            {PYTRITON: getattr(args, "pytriton", None), LITSERVE: getattr(args, "litserve", None)}, quick)))
        if peers is not None:
            notes.append(peers.note())
            log(peers.note())
        raw, echo_raw = Raw(server.host, server.port), Raw(echo_server.host, echo_server.port)
        peer_raw = Raw(peer.host, peer.port) if peer else None
        grpc = grpc_columns.GrpcColumns(server, echo_server)
        try:
            for index, (model, batch, seq) in enumerate(cases):
                arrays = all_inputs[(model, batch, seq)]
                shape: dict[str, Any] = {"model": model, "batch": batch, "seq": seq}
                anchors["ort"].load("ort", **shape, device=device)
                anchors["ort twin"].load("ort", **shape, device=device)
                if "torch" in anchors:
                    anchors["torch"].load("torch", **shape, device=device)
                if "binding" in anchors:
                    anchors["binding"].load("ort", **shape, device=device, binding=True)
                expected = anchors["ort"].output()
                binary, request_bytes, response_bytes, binary_timing = binary_call(raw, model, arrays)
                np.testing.assert_allclose(binary(), expected, atol=1e-4, rtol=1e-4)
                echo_body, echo_headers = bytes(request_bytes), {ANSWER_HEADER.decode(): str(response_bytes)}
                socket_echo = SocketEcho(echo_server.host, echo_server.port, request_bytes, response_bytes)
                shared = SharedMemoryCase(server, arrays, str(index))
                zero_copy = ZeroCopyCase(socket_path, arrays, str(index))
                zero_copy_call = zero_copy.call(model)
                pageable = ZeroCopyCase(pageable_path, arrays, str(index)) if binding_column else None
                try:
                    calls: dict[str, Callable[[], Any]] = {
                        "echo": partial(echo_raw.post, ECHO_PATH, echo_body, echo_headers),
                        "socket echo": socket_echo.call,
                        "binary": binary, "shm": zero_copy_call, "shm copied": shared.call(raw, model)}
                    if pageable is not None:
                        calls["shm pageable"] = pageable.call(model)
                        np.testing.assert_allclose(calls["shm pageable"](), expected, atol=1e-4, rtol=1e-4)
                    if peer_raw is not None:
                        calls["kserve"] = binary_call(peer_raw, model, arrays)[0]
                        np.testing.assert_allclose(calls["kserve"](), expected, atol=1e-4, rtol=1e-4)
                    np.testing.assert_allclose(calls["shm"](), expected, atol=1e-4, rtol=1e-4)
                    calls.update(grpc.calls(model, arrays))
                    for name in ("shm copied", "grpc", "grpc tritonclient", "http tritonclient"):
                        np.testing.assert_allclose(calls[name](), expected, atol=1e-4, rtol=1e-4)
                    if peers is not None:  # each checked against `expected`; one that fails is left out, with why
                        calls.update(peers.calls(model, arrays, expected))
                    sides: dict[str, Callable[[int], list[float]]] = {
                        name: partial(burst_ms, call) for name, call in calls.items()}
                    sides.update({name: anchor.burst for name, anchor in anchors.items()})
                    times = measured(sides, repeat, QUICK_BURST_MS if quick else BURST_MS, MOST_CALLS)
                    spans = {"binary": median_phases(binary_timing, repeat),
                             "shm": median_phases(zero_copy.timing_call(model), repeat),
                             "grpc": median_phases(grpc.timing_call(model, arrays), repeat)}
                finally:
                    shared.close()
                    zero_copy.close()
                    if pageable is not None:
                        pageable.close()
                    socket_echo.close()
                ms = {name: med(values) for name, values in times.items()}
                overhead, shm_ratio = (ms["binary"] - ms["ort"]) / ms["echo"], ms["ort"] / ms["shm"]
                held = targets(batch, seq)
                overhead_note, shm_note = ("" if name in held else " (n/a)" for name in ("overhead", "shm"))
                table.append(f"| {model} | {batch} | {seq} | {request_bytes / 1e6:.1f} / {response_bytes / 1e6:.1f} "
                             f"| {ms['echo']:.2f} ms | {ms['binary']:.2f} ms | {ms['shm']:.2f} ms "
                             f"| {ms['shm copied']:.2f} ms | {ms['ort']:.2f} ms | {ms['ort twin']:.2f} ms"
                             + (f" | {ms['binding']:.2f} ms | {ms['shm pageable']:.2f} ms" if binding_column else "")
                             + (f" | {ms['torch']:.2f} ms" if has_torch else " | n/a")
                             + (f" | {ms['kserve']:.2f} ms" if "kserve" in ms else " | n/a")
                             + f" | {overhead:.2f}{overhead_note} | {shm_ratio:.2f}{shm_note}"
                             + grpc.cells(times) + " |")
                log(table[-1])
                report.rows += case_rows(model, batch, seq, times, threads)
                report.rows += grpc.rows(model, batch, seq, times)
                case = (model, batch, seq)
                if peers is not None:  # the 8-client rounds: posenc's and every live peer's request, each alone
                    report.rows += peers.measure(case, server, times, args.rounds or PEER_ROUNDS, args.seconds,
                                                 med(times["ort twin"]) / med(times["ort"]))
                profile += [
                    profile_row(case, "HTTP binary", ms["binary"], ms["ort"], spans["binary"], ms["socket echo"],
                                ms["echo"] - ms["socket echo"]),
                    profile_row(case, "HTTP shm zero-copy", ms["shm"], ms["ort"], spans["shm"]),
                    profile_row(case, "gRPC raw", ms["grpc"], ms["ort"], spans["grpc"], ms["grpc echo"]),
                    profile_row(case, "HTTP tritonclient", ms["http tritonclient"], ms["ort"], spans["binary"]),
                    profile_row(case, "gRPC tritonclient", ms["grpc tritonclient"], ms["ort"], spans["grpc"],
                                ms["grpc echo"], ms["grpc tritonclient echo"] - ms["grpc echo"])]
                for line in profile[-5:]:
                    log(line)
        finally:
            for client in (raw, echo_raw, peer_raw):
                if client is not None:
                    client.close()
            grpc.close()
            if peers is not None:
                report.rows += peers.rows_not_measured()
                report.tables.append(peers.table(threads))
    report.tables.append("\n".join(table))
    report.tables.append("\n".join([NOTE, HEADER, *profile]))
    return report
