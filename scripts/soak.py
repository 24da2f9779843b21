"""Bounded soak test: mixed load and faulty clients against a real `posenc serve`, then SIGTERM under load.

    python scripts/soak.py [--seconds 60] [--concurrency 64] [--seed 0] [--max-rss-mib N] [--crowd-seconds 45]

Starts `python -m posenc.service.cli serve` on a free loopback port (short header/body/graceful timeouts, so the
fault clients meet them within the run), drives it with `--concurrency` keep-alive clients (cached and
uncached tables of several families and formats, JSON and binary KServe v2 infer on `rope_attention`,
.npy uploads to /v1/t5/bias, config.json audits with a RoPE per layer type: 16, audited, and 1,000, refused at once)
plus fault clients (disconnect mid-body, trickle a body, send half a head then
idle, stall a body), and sends SIGTERM while the load runs. Fails (exit 1) on: any 5xx, except 503 with
Retry-After (overload: allowed, counted apart); any other non-2xx answer to the load; a request fully
sent before the SIGTERM that got no complete answer (a lost response); a fault client the server did not
end within its timeout (+5 s); an ERROR line in the server log; a server exit status other than 0, or later than
the graceful timeout (+2 s); a peak RSS (VmHWM) over --max-rss-mib. The request mix is seeded.

Shared memory is on (with the test kit's restricted-API key) and the server runs under a 1,024-descriptor
limit (systemd's default): shared-memory clients register an object, send an infer that reads it and write
into it, and truncate the object while the request runs (answers: 200 or a 400 naming the shrink, never a
5xx or a dead server); one client registers 1,100 regions, more than the descriptors allow (200, then 503
with Retry-After or the region-count 400; never a 500). A spelling flood sends distinct 32 KiB Accept headers
(200) and heads over POSENC_MAX_HEADER_BYTES (431): none of them may stay in memory.

Slow readers ask for distinct uncached 16 MiB tables, four at a time, and read nothing: their bodies stay
in the memory budget (192 MiB for the run, so that the RSS bound covers it full) until POSENC_SEND_TIMEOUT
(--send-timeout) cuts them, which must happen (or a 503 when the table waited too long for memory). A
client posts 32 MiB JSON infer bodies of "0.5,..." (400 naming the element count, or 503 with Retry-After).

gRPC clients run beside the HTTP load (scripts/soak_grpc.py): unary and streamed inferences, abandoned and idle
streams, and ModelInfer calls that send their headers and never a message (two at a time, each given up after 15 s:
the memory held for their messages must go to the requests that wait, so the load beside them does not starve).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import resource
import signal
import socket
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's service and test kit, whatever the environment has installed

from posenc.service.audit_limits import MAX_LAYER_TYPES  # noqa: E402
from posenc.service.settings import Settings  # noqa: E402
from posenc.service.testing import (  # noqa: E402
    SHARED_MEMORY_HEADERS,
    HttpRequest,
    LoadGenerator,
    Outcome,
    RequestedOutput,
    ServerProcess,
    SharedMemory,
    attention_inputs,
    kserve_request,
    layered_config,
    read_response,
    request_bytes,
    shared_memory_inputs,
    shared_memory_key_settings,
)
from scripts.soak_grpc import IDLE_SECONDS as GRPC_IDLE_SECONDS  # noqa: E402
from scripts.soak_grpc import KINDS as GRPC_KINDS  # noqa: E402
from scripts.soak_grpc import grpc_load  # noqa: E402

MiB = 1024 * 1024
HOST = "127.0.0.1"
SLACK = 2.0  # seconds the server may exit after its graceful timeout
FAULT_SLACK = 5.0  # seconds a fault client may stay open past its timeout (event loops run late under full load)

CACHED = [  # the same URLs again and again: answered from the LRU cache after the first time
    "/v1/rope?max_position=2048&head_dim=128&rope_theta=500000&rope_type=llama3&factor=8&low_freq_factor=1"
    "&high_freq_factor=4&original_max_position_embeddings=8192",
    "/v1/rope?max_position=4096&head_dim=64&form=half&format=npy&tensor=cos",
    "/v1/sinusoidal?max_position=2048&dim=512",
    "/v1/sinusoidal?max_position=64&dim=16&variant=fairseq&format=json",
    "/v1/alibi/bias?num_heads=16&query_length=128&key_length=512&format=raw",
    "/v1/alibi/slopes?num_heads=12&format=json",
    "/v1/t5/buckets?query_length=256&key_length=256&format=npy",
    "/v1/deberta/buckets?query_length=128&key_length=128&dtype=int32&format=raw",
    "/v1/relative/clipped?query_length=16&key_length=16&max_relative_position=4&format=json",
]
DESCRIPTOR_LIMIT = 1024  # the server's RLIMIT_NOFILE during the soak (systemd's default soft limit)
REGISTER_FLOOD = 1100  # regions one client tries to register: more than the descriptors allow
MIX = {"table-cached": 35, "table-uncached": 25, "infer-json": 15, "infer-binary": 15, "t5-upload": 10,
       "config-layers": 4}
# config.json uploads to POST /v1/audit with a RoPE per layer type (transformers 5): MAX_LAYER_TYPES of them, audited
# (200), and 1,000 (65 KB), which cost 21 s of CPU each once: refused at once (400) naming the bound
LAYERED = {"config-layers": MAX_LAYER_TYPES, "config-layers-over": 1000}
REFUSED = {"config-layers-over": 400}  # the answer these kinds must get


def uncached_url(rng: random.Random) -> str:
    """A table nobody asked for yet (a random offset): computed, encoded and put into the cache."""
    offset, fmt = rng.randrange(1 << 20), rng.choice(["safetensors", "npy", "raw"])
    family = rng.choice(["sinusoidal", "rope", "alibi", "t5"])
    if family == "sinusoidal":
        query = f"max_position={rng.randint(1, 1024)}&dim={rng.choice([32, 64, 256])}&offset={offset}"
    elif family == "rope":
        query = f"max_position={rng.randint(1, 1024)}&head_dim={rng.choice([64, 128])}&offset={offset}" + (
            "&tensor=sin" if fmt != "safetensors" else "")
    elif family == "alibi":
        return (f"/v1/alibi/bias?num_heads={rng.randint(1, 32)}&query_length={rng.randint(1, 64)}"
                f"&key_length={rng.randint(64, 512)}&format={fmt}")
    else:
        return f"/v1/t5/buckets?query_length={rng.randint(1, 64)}&key_length=128&offset={offset}&format={fmt}"
    return f"/v1/{family}?{query}&format={fmt}"


def payloads(seed: int) -> dict[str, list[HttpRequest]]:
    """Pre-built requests (client CPU goes to sending, not to building JSON)."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[HttpRequest]] = defaultdict(list)
    infer = "/v2/models/rope_attention/infer"
    for seq in (1, 2, 4, 8):
        tensors = attention_inputs(8, 8, 64, 1, seq, seed=seed + seq, start=int(rng.integers(0, 4000)))
        as_json = kserve_request(tensors, binary=False, content_type=True)
        out["infer-json"].append(HttpRequest("POST", infer, as_json.body, as_json.headers, "infer-json"))
        binary = kserve_request(tensors, binary_output=True, content_type=True)
        out["infer-binary"].append(HttpRequest("POST", infer, binary.body, binary.headers, "infer-binary"))
        buffer = io.BytesIO()
        np.save(buffer, rng.standard_normal((32, 8)).astype(np.float32))
        out["t5-upload"].append(HttpRequest("POST", f"/v1/t5/bias?query_length={16 * seq}&key_length=64",
                                            buffer.getvalue(), {"Content-Type": "application/x-npy"}, "t5-upload"))
    for label, types in LAYERED.items():
        out["config-layers"].append(HttpRequest("POST", "/v1/audit", json.dumps(layered_config(types)).encode(),
                                                {"Content-Type": "application/json"}, label))
    return out


@dataclass
class Result:
    kind: str
    outcome: str  # an HTTP status, or what happened to the connection
    latency: float
    sent_before_sigterm: bool | None  # None: the request was never fully sent
    violation: str | None = None


class Soak:
    def __init__(self, args: argparse.Namespace, server: ServerProcess) -> None:
        self.args, self.server = args, server
        self.results: list[Result] = []
        self.sigterm_at: float | None = None
        self.bodies = payloads(args.seed)
        self.rngs = [random.Random(args.seed * 100_003 + index) for index in range(args.concurrency)]
        self.peak_rss = self.peak_hwm = 0

    def record(self, kind: str, outcome: str, start: float, sent_at: float | None, violation: str | None = None
               ) -> None:  # sent_at: when the request's last byte was in the kernel (None: never fully sent)
        before = None if sent_at is None else (self.sigterm_at is None or sent_at < self.sigterm_at)
        self.results.append(Result(kind, outcome, time.monotonic() - start, before, violation))

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection(HOST, self.server.port)
        writer.transport.set_write_buffer_limits(0)  # drain() returns once every byte is in the kernel
        return reader, writer

    def next_request(self, index: int, step: int) -> HttpRequest:
        """Load client `index`'s next request: a kind drawn by the weights of MIX, then one of its requests."""
        rng = self.rngs[index]
        kind = rng.choices(list(MIX), list(MIX.values()))[0]
        if kind == "table-cached":
            return HttpRequest("GET", rng.choice(CACHED), label=kind)
        if kind == "table-uncached":
            return HttpRequest("GET", uncached_url(rng), label=kind)
        return rng.choice(self.bodies[kind])

    def observe(self, done: Outcome) -> bool:
        """Record one load request; False ends its client (the server stopped listening after the SIGTERM)."""
        kind = done.request.label
        if done.status is None:
            if self.sigterm_at is not None and done.sent_at is None:
                return False
            error = (done.error or "error").split(":")[0]
            failed = f"{error} before SIGTERM" if self.sigterm_at is None and done.sent_at is None else None
            self.record(kind, error, done.started, done.sent_at, failed)
            return True
        status, violation = done.status, None
        if kind in REFUSED:
            violation = None if status in (REFUSED[kind], 503) else f"got {status}, expected {REFUSED[kind]}"
            self.record(kind, str(status), done.started, done.sent_at, violation)
            return True
        if status >= 500 and not (status == 503 and "retry-after" in done.headers):
            violation = f"{status} answer"
        elif status >= 300 and status != 503:
            violation = f"unexpected {status}"
        self.record(kind, "503+Retry-After" if status == 503 and not violation else str(status), done.started,
                    done.sent_at, violation)
        return True

    async def fault_client(self, kind: str, index: int) -> None:
        rng = random.Random(self.args.seed * 7919 + index)
        a = self.args
        body = self.bodies["t5-upload"][0].encoded
        head, payload = body.split(b"\r\n\r\n", 1)
        head += b"\r\n\r\n"
        while self.sigterm_at is None and self.server.poll() is None:
            start = time.monotonic()
            try:
                reader, writer = await self.connect()
            except OSError:
                return
            try:
                if kind == "fault-disconnect":  # half the body, then gone: the server must not mind
                    writer.write(head + payload[:len(payload) // 2])
                    await writer.drain()
                    await asyncio.sleep(rng.uniform(0, 0.2))
                    self.record(kind, "client closed", start, None)
                elif kind == "fault-trickle":  # 8 pieces: each gap under the body timeout, all within the drain
                    writer.write(head)
                    step = len(payload) // 8 + 1
                    for offset in range(0, len(payload), step):
                        await asyncio.sleep(min(a.body_timeout / 3, a.graceful_timeout / 10))
                        writer.write(payload[offset:offset + step])
                        await writer.drain()
                    sent_at = time.monotonic()
                    status, *_ = await asyncio.wait_for(read_response(reader), 60)
                    self.record(kind, str(status), start, sent_at, None if status == 200 else f"trickle got {status}")
                else:  # half a head, or a stalled body: the server must end it within its timeout
                    stalled = kind == "fault-stalled-body"
                    writer.write(head + payload[:100] if stalled else head[:40])
                    await writer.drain()
                    limit = (a.body_timeout if stalled else a.header_timeout) + FAULT_SLACK
                    data = await asyncio.wait_for(reader.read(), limit)
                    outcome = data[:12].decode("latin-1").replace("HTTP/1.1 ", "") if data else "server closed"
                    violation = None if outcome in ("408", "server closed") else f"{kind} got {outcome}"
                    self.record(kind, outcome, start, None, violation)
            except TimeoutError:
                self.record(kind, "still open", start, None, f"{kind}: not ended by the server in time")
            except (OSError, asyncio.IncompleteReadError) as exc:
                self.record(kind, type(exc).__name__, start, None)
            finally:
                writer.close()

    async def exchange(self, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
        """One request with the shared-memory key on a fresh connection: status, headers, body."""
        reader, writer = await self.connect()
        try:
            writer.write(request_bytes(method, path, body, SHARED_MEMORY_HEADERS))
            await writer.drain()
            status, headers, answer, _ = await asyncio.wait_for(read_response(reader), 60)
            return status, headers, answer or b""
        finally:
            writer.close()

    async def shared_memory_truncation(self, index: int) -> None:
        """Register an object, infer from it, truncate it while the request runs; again and again."""
        rng = random.Random(self.args.seed * 104_729 + index)
        inputs = attention_inputs(8, 8, 64, 4, 256)
        data = b"".join(array.tobytes() for array in inputs.values())
        size, region = len(data) + inputs["query"].nbytes, f"soak-truncated-{index}"
        path = Path(f"/dev/shm/posenc_soak_{os.getpid()}_{index}")
        output = RequestedOutput("output", shared_memory=SharedMemory(region, inputs["query"].nbytes, len(data)))
        body = kserve_request(shared_memory_inputs(inputs, region), outputs=[output]).body
        register = json.dumps({"key": f"/{path.name}", "byte_size": size}).encode()
        try:
            while self.sigterm_at is None and self.server.poll() is None:
                path.write_bytes(data.ljust(size, b"\0"))
                start = time.monotonic()
                try:
                    # unregistering first is idempotent (Triton): a round cut short left nothing behind
                    await self.exchange("POST", f"/v2/systemsharedmemory/region/{region}/unregister")
                    status, _, answer = await self.exchange("POST", f"/v2/systemsharedmemory/region/{region}/register",
                                                            register)
                    if status != 200:
                        self.record("shm-truncated", f"register {status}", start, None,
                                    None if status == 503 else f"register got {status}: {answer[:200]!r}")
                        await asyncio.sleep(0.2)
                        continue
                    infer = asyncio.create_task(self.exchange("POST", "/v2/models/rope_attention/infer", body))
                    if rng.random() < 0.5:  # else left alone: the same request must then succeed
                        await asyncio.sleep(rng.uniform(0, 0.03))
                        os.truncate(path, rng.choice([0, 4096]))
                    status, headers, answer = await infer
                    shrank = status == 400 and b"now has" in answer
                    overload = status == 503 and "retry-after" in headers
                    violation = None if status == 200 or shrank or overload else f"got {status}: {answer[:200]!r}"
                    self.record("shm-truncated", str(status), start, time.monotonic(), violation)
                except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                    if self.sigterm_at is None and self.server.poll() is None:
                        self.record("shm-truncated", type(exc).__name__, start, None, f"no answer: {exc}")
        finally:
            path.unlink(missing_ok=True)

    async def spelling_flood(self) -> None:
        """Distinct big Accept headers (32 KiB, under the head limit) on one cached table, and heads over the
        limit: 200s and 431s, and nothing of them stays in memory (the RSS bound holds)."""
        index = 0
        while self.sigterm_at is None and self.server.poll() is None:
            index += 1
            start = time.monotonic()
            over = index % 10 == 0
            accept = f"x/{index:08d}{'j' * ((80 if over else 32) << 10)}, */*"
            try:
                reader, writer = await self.connect()
            except OSError:
                return
            try:
                writer.write(request_bytes("GET", "/v1/alibi/slopes?num_heads=12", b"", {"Accept": accept}))
                await writer.drain()
                status, _, _, _ = await asyncio.wait_for(read_response(reader, keep_body=False), 60)
                expected = 431 if over else 200
                self.record("spelling-flood", str(status), start, time.monotonic(),
                            None if status == expected else f"got {status}, expected {expected}")
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                if self.sigterm_at is None:
                    self.record("spelling-flood", type(exc).__name__, start, None,
                                None if over else f"no answer: {exc}")
            finally:
                writer.close()

    async def shared_memory_register_flood(self) -> None:
        """More registers than the server has descriptors: 200s, then 503 with Retry-After, never a 500."""
        path = Path(f"/dev/shm/posenc_soak_flood_{os.getpid()}")
        path.write_bytes(b"\0" * 4096)
        register = json.dumps({"key": f"/{path.name}", "byte_size": 4096}).encode()

        async def one(index: int) -> None:
            start = time.monotonic()
            status, headers, answer = await self.exchange(
                "POST", f"/v2/systemsharedmemory/region/flood-{index}/register", register)
            allowed = status == 200 or (status == 503 and "retry-after" in headers) or (
                status == 400 and b"regions are registered" in answer)
            self.record("shm-register-flood", str(status), start, time.monotonic(),
                        None if allowed else f"got {status}: {answer[:200]!r}")

        try:
            await asyncio.sleep(self.args.seconds / 4)
            for first in range(0, REGISTER_FLOOD, 10):  # ten at a time
                if self.sigterm_at is not None:
                    return
                await asyncio.gather(*(one(index) for index in range(first, min(first + 10, REGISTER_FLOOD))))
            for first in range(0, REGISTER_FLOOD, 10):  # its own regions only: an unregister-all would take the
                if self.sigterm_at is not None:  # truncation clients' regions from under their requests
                    return
                await asyncio.gather(*(
                    self.exchange("POST", f"/v2/systemsharedmemory/region/flood-{index}/unregister")
                    for index in range(first, min(first + 10, REGISTER_FLOOD))))
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            if self.sigterm_at is None:
                self.record("shm-register-flood", type(exc).__name__, time.monotonic(), None, f"no answer: {exc}")
        finally:
            path.unlink(missing_ok=True)

    async def slow_readers(self) -> None:
        """Clients that ask for distinct uncached 16 MiB tables and read nothing, four at a time: their bodies
        stay in the memory budget (not beyond it) until POSENC_SEND_TIMEOUT cuts them, which must happen."""
        index = 0
        while self.sigterm_at is None and self.server.poll() is None:
            index += 4
            await asyncio.gather(*(self.slow_reader(index + i) for i in range(4)))

    async def slow_reader(self, index: int) -> None:
        start = time.monotonic()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (HOST, self.server.port))
        except OSError:
            sock.close()
            return
        try:
            url = f"/v1/alibi/bias?num_heads=4&query_length=1024&key_length=1024&format=raw&alibi_bias_max={index}"
            await asyncio.get_running_loop().sock_sendall(sock, request_bytes("GET", url))
            limit = self.args.send_timeout + FAULT_SLACK + 15  # (computing the table may wait for memory)
            await asyncio.sleep(limit)  # computed (maybe after a wait for memory), then cut while we do not read
            ended = await asyncio.to_thread(_how_it_ended, sock, 16 << 20)
            if self.sigterm_at is None:
                self.record("slow-reader", ended or "not cut", start, None,
                            None if ended else f"not cut within {limit:g} s (POSENC_SEND_TIMEOUT)")
        finally:
            sock.close()

    async def large_json_bodies(self) -> None:
        """A 32 MiB JSON infer body of "0.5,..." (8.4 M numbers, one too many for its shape) every few seconds:
        400 naming the count (or 503 with Retry-After when the budget is busy), within the RSS bound."""
        count = (32 << 20) // 4
        body = (b'{"inputs":[{"name":"query","datatype":"FP32","shape":[1,8,%d,64],"data":[' % (count // 512)
                + b"0.5," * count + b"0.5]}]}")
        while self.sigterm_at is None and self.server.poll() is None:
            start = time.monotonic()
            try:
                status, headers, answer = await self.exchange("POST", "/v2/models/rope_attention/infer", body)
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                if self.sigterm_at is None:
                    self.record("large-json", type(exc).__name__, start, None, f"no answer: {exc}")
                return
            allowed = (status == 400 and b"elements" in answer) or (status == 503 and "retry-after" in headers)
            self.record("large-json", str(status), start, time.monotonic(),
                        None if allowed else f"got {status}: {answer[:200]!r}")
            await asyncio.sleep(2)

    async def sample_rss(self) -> None:
        status = Path(f"/proc/{self.server.pid}/status")
        while self.server.poll() is None:
            try:
                fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
                self.peak_rss = max(self.peak_rss, int(fields["VmRSS"].split()[0]) * 1024)
                self.peak_hwm = max(self.peak_hwm, int(fields["VmHWM"].split()[0]) * 1024)
            except (OSError, KeyError, ValueError):
                pass
            await asyncio.sleep(0.2)

    async def run(self) -> tuple[int | None, float]:
        faults = ["fault-disconnect", "fault-trickle", "fault-partial-head", "fault-stalled-body"]
        limit = self.args.graceful_timeout + SLACK
        load = LoadGenerator(self.server.port, connections=self.args.concurrency, timeout=60,
                             seconds=self.args.seconds + limit + 10 + 70)  # the bound: load, drain, last answers
        tasks = [asyncio.create_task(load.run_async(self.next_request, self.observe,
                                                    stop=lambda: self.server.poll() is not None))]
        tasks += [asyncio.create_task(self.fault_client(kind, i)) for i, kind in enumerate(faults * 2)]
        tasks += [asyncio.create_task(self.shared_memory_truncation(i)) for i in range(2)]
        tasks.append(asyncio.create_task(self.shared_memory_register_flood()))
        tasks.append(asyncio.create_task(self.spelling_flood()))
        tasks += [asyncio.create_task(self.slow_readers()), asyncio.create_task(self.large_json_bodies())]
        tasks.append(asyncio.create_task(grpc_load(self)))  # gRPC clients beside the HTTP load (scripts/soak_grpc.py)
        sampler = asyncio.create_task(self.sample_rss())
        await asyncio.sleep(self.args.seconds)
        self.sigterm_at = time.monotonic()
        self.server.send_signal(signal.SIGTERM)
        while self.server.poll() is None and time.monotonic() < self.sigterm_at + limit + 10:
            await asyncio.sleep(0.05)
        exit_after = time.monotonic() - self.sigterm_at
        await asyncio.wait([*tasks, sampler], timeout=70)
        for task in [*tasks, sampler]:
            task.cancel()
        return self.server.poll(), exit_after


def _how_it_ended(sock: socket.socket, body_bytes: int) -> str | None:
    """Read what the server sent to a client that read nothing for a while: "cut" (the stream ends, or is
    reset, before the whole body: the server gave up on it), "503" (the table waited too long for memory:
    allowed), or None (the whole answer came: nothing cut it)."""
    sock.setblocking(True)
    sock.settimeout(30)
    received, head = 0, b""
    try:
        while chunk := sock.recv(1 << 20):
            head = head or chunk[:12]
            received += len(chunk)
            if head == b"HTTP/1.1 503":
                return "503"
    except (ConnectionError, TimeoutError):
        pass
    return "cut" if received < body_bytes else None


def percentile(values: list[float], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def error_blocks(log: str) -> list[str]:
    """Each ERROR line of the log with the lines that follow it up to the next log line (its traceback)."""
    blocks: list[list[str]] = []
    for line in log.splitlines():
        if " ERROR " in line:
            blocks.append([line])
        elif blocks and not line[:4].isdigit():  # a traceback's lines carry no timestamp
            blocks[-1].append(line)
    return ["\n".join(block) for block in blocks]


def report(soak: Soak, status: int | None, exit_after: float, max_rss: int, log: str) -> list[str]:
    by_kind: dict[str, list[Result]] = defaultdict(list)
    for r in soak.results:
        by_kind[r.kind].append(r)
    print(f"\n{'kind':<20}{'n':>7}  {'p50 ms':>8}{'p99 ms':>9}  outcomes")
    for kind, results in sorted(by_kind.items()):
        ok = [r.latency * 1000 for r in results if r.outcome[:3].isdigit() or r.outcome == "server closed"]
        outcomes = ", ".join(f"{k}: {v}" for k, v in sorted(Counter(r.outcome for r in results).items()))
        print(f"{kind:<20}{len(results):>7}  {percentile(ok, 0.5):>8.1f}{percentile(ok, 0.99):>9.1f}  {outcomes}")
    violations = [f"{r.kind}: {r.violation}" for r in soak.results if r.violation]
    lost = [r for r in soak.results if r.sent_before_sigterm and not r.outcome[:3].isdigit()]
    violations += [f"{r.kind}: lost response ({r.outcome}) for a request sent before SIGTERM" for r in lost]
    after = sum(1 for r in soak.results if r.sent_before_sigterm is False)
    overload = sum(1 for r in soak.results if r.outcome == "503+Retry-After")
    errors = [line for line in log.splitlines() if " ERROR " in line or "Traceback" in line]
    violations += [f"server log: {line}" for line in errors[:5]]
    if errors:  # each error with its traceback, whole: what a failed run is read for
        print("\nserver log errors:\n" + "\n".join(error_blocks(log)[:4]))
    if status != 0:
        violations.append(f"server exit status {status} (expected 0)")
    if exit_after > soak.args.graceful_timeout + SLACK:
        violations.append(f"server exited {exit_after:.1f} s after SIGTERM (graceful timeout "
                          f"{soak.args.graceful_timeout:g} s + {SLACK:g} s)")
    if soak.peak_hwm > max_rss:
        violations.append(f"peak RSS {soak.peak_hwm / MiB:.0f} MiB over --max-rss-mib {max_rss / MiB:.0f}")
    for kind in [*MIX, "shm-truncated", "shm-register-flood", "spelling-flood", *GRPC_KINDS]:
        if not any(r.outcome == "200" for r in by_kind[kind]):
            violations.append(f"{kind}: no successful request at all")
    for kind, refused in REFUSED.items():
        if not any(r.outcome == str(refused) for r in by_kind[kind]):
            violations.append(f"{kind}: never answered {refused}")
    print(f"\nrequests: {len(soak.results)}; 503 with Retry-After (allowed): {overload}; "
          f"sent after SIGTERM, not required to succeed: {after}; lost: {len(lost)}")
    print(f"server: exit status {status}, {exit_after:.2f} s after SIGTERM; peak RSS (VmHWM) "
          f"{soak.peak_hwm / MiB:.0f} MiB (sampled VmRSS max {soak.peak_rss / MiB:.0f} MiB; "
          f"bound {max_rss / MiB:.0f} MiB); server log ERROR lines: {len(errors)}")
    return violations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60, help="load duration before the SIGTERM")
    parser.add_argument("--concurrency", type=int, default=64, help="keep-alive load clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-rss-mib", type=float, help="peak RSS bound (default: the documented one)")
    parser.add_argument("--header-timeout", type=float, default=2.0, help="POSENC_HEADER_TIMEOUT for the run")
    parser.add_argument("--body-timeout", type=float, default=3.0, help="POSENC_BODY_TIMEOUT for the run")
    parser.add_argument("--send-timeout", type=float, default=5.0, help="POSENC_SEND_TIMEOUT for the run")
    parser.add_argument("--graceful-timeout", type=float, default=10.0, help="POSENC_GRACEFUL_SHUTDOWN_TIMEOUT")
    parser.add_argument("--crowd-seconds", type=float, default=45,
                        help="the mixed crowds' duration, shared by the mixes of scripts/crowd.py (0: none)")
    parser.add_argument("--crowd-clients", type=int, default=64, help="the clients of each mixed crowd")
    args = parser.parse_args()
    settings = {"workers": 1, "log_level": "warning", "access_log": False, "header_timeout": args.header_timeout,
                "body_timeout": args.body_timeout, "graceful_shutdown_timeout": args.graceful_timeout,
                "shared_memory": True, **shared_memory_key_settings(),
                # a budget the RSS bound covers while slow readers fill it; their cut comes soon
                "memory_budget_bytes": 192 * MiB, "send_timeout": args.send_timeout,
                # the largest body sent is 32 MiB of JSON: a gRPC message's read holds twice this limit of the
                # budget until its size is known (posenc.service.grpc.servicer.receive)
                "max_request_bytes": 40 * MiB,
                # idle gRPC streams are ended soon, so the soak sees it happen (scripts/soak_grpc.py)
                "grpc_stream_idle_seconds": GRPC_IDLE_SECONDS,
                # serving under load is measured, not the start-up calibration of the CPU forms (its B=1 runs up
                # to S=1024 hold llama3_1's 256 MiB of scores once, before ready: tests/inference/test_calibration.py)
                "cpu_form_from": "config"}
    # The server inherits this process's descriptor limit: systemd's default, whatever the shell allows.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(DESCRIPTOR_LIMIT, hard), hard))
    # the documented bound (docs/operations.md, `posenc.service.budget.memory_bound`) for this run's settings
    from posenc.service.budget import memory_bound

    max_rss = int(args.max_rss_mib * MiB) if args.max_rss_mib else memory_bound(Settings(**settings))
    server = ServerProcess(settings, host=HOST, cwd=ROOT, ready="/readyz", ready_timeout=120, grpc=True)
    try:
        server.start()
    except RuntimeError as exc:
        sys.stderr.write(f"the server did not become ready: {exc}\n")
        return 1
    try:
        print(f"posenc serve on port {server.port}: {args.seconds:g} s of load, concurrency {args.concurrency}, "
              f"seed {args.seed}; header/body/graceful timeouts {args.header_timeout:g}/{args.body_timeout:g}/"
              f"{args.graceful_timeout:g} s")
        soak = Soak(args, server)
        status, exit_after = asyncio.run(soak.run())
    finally:
        server.stop(signal.SIGKILL, timeout=5)  # already gone after a clean run
    log = server.log()
    violations = report(soak, status, exit_after, max_rss, log)
    if args.crowd_seconds > 0:
        from crowd import check_crowd  # scripts/crowd.py, beside this file
        violations += check_crowd(args.crowd_seconds, args.crowd_clients, args.seed)
    if violations:
        print(f"\nFAILED: {len(violations)} violation(s)")
        for line in violations[:30]:
            print("  " + line)
        print("\nserver log (last 20 lines):\n" + "\n".join(log.splitlines()[-20:]))
        return 1
    print("\nOK: no 5xx, no lost responses, clean exit within the graceful timeout, RSS within bound"
          + ("; the crowds within their memory bound, /healthz within a second" if args.crowd_seconds > 0 else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
