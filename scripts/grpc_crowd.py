"""What gRPC core buffers is bounded (issue 55, item 3): a real `posenc serve`, its peak resident size (VmHWM) and
/readyz sampled every second on a connection of its own, under

* streams: many `ModelStreamInfer` streams (default 1,000 × 12 requests of 0.38 MiB, from a few channels), whose
  answers are never read;
* large: concurrent large unary `ModelInfer` calls (default 32 × 60 MiB);
* gzip: the same, gzip-compressed (24 × 60 MiB of zeros, about 60 kB each on the wire);
* silent: `ModelInfer` calls that send their headers and nothing else (default 32, each on a connection of its
  own), held open for `--seconds`, while HTTP clients ask for a 2 MiB table and a 148 KB inference again and again:
  every HTTP answer must be a 200 (issue 62: eight such calls used to hold the whole memory budget);
* large-streams: `ModelStreamInfer` streams of one large request each (default 24 × 60 MiB over 8 connections).

Each scenario runs on a fresh server (VmHWM is the process's lifetime peak). Exit 1 when a peak is over the bound of
docs/operations.md "Memory" (`posenc.service.budget.memory_bound`), /readyz took over 1 s, or an HTTP client of
`silent` got anything but a 200.

    .venv/bin/python scripts/grpc_crowd.py                 # all of them, the issues' sizes
    .venv/bin/python scripts/grpc_crowd.py streams --streams 200 --seconds 15
    .venv/bin/python scripts/grpc_crowd.py silent --calls 8
    .venv/bin/python scripts/grpc_crowd.py large-streams --calls 48
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's service and test kit, whatever the environment has installed

from posenc.service.budget import memory_bound  # noqa: E402
from posenc.service.settings import Settings  # noqa: E402
from posenc.service.testing import LOOPBACK, ServerProcess, attention_inputs  # noqa: E402

MiB = 1024 * 1024
SERVICE = "/inference.GRPCInferenceService/"
MODEL = "rope_attention"
READYZ_LIMIT_SECONDS = 1.0
SCENARIOS = ("streams", "large", "gzip", "silent", "large-streams")
TABLE = "/v1/sinusoidal?max_position=1024&dim=512&format=npy"  # 2 MiB of float32


def peak_rss(pid: int, field: str = "VmHWM") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for process {pid}")


def infer_request(batch: int, seq: int, *, seed: int = 0, zeros: bool = False) -> bytes:
    """A valid rope_attention ModelInferRequest (8 heads of 64): 0.375 MiB per batch row of 64 positions."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL, id=str(seed))
    for name, array in attention_inputs(8, 8, 64, batch, seq, seed=seed).items():
        if zeros and array.dtype == np.float32:
            array = np.zeros_like(array)
        request.inputs.add(name=name, datatype="FP32" if array.dtype == np.float32 else "INT64", shape=array.shape)
        request.raw_input_contents.append(array.tobytes())
    return request.SerializeToString()


class ReadyzSampler(threading.Thread):
    """GET /readyz every second, each on a new connection of its own; the worst latency and the slow samples."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.worst = 0.0
        self.slow = 0
        self.samples = 0
        self.failures: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            start = time.monotonic()
            try:
                conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=30)
                conn.request("GET", "/readyz")
                response = conn.getresponse()
                response.read()
                conn.close()
                if response.status != 200:
                    self.failures.append(f"/readyz {response.status}")
            except OSError as exc:
                self.failures.append(f"/readyz {exc!r}")
            took = time.monotonic() - start
            self.samples += 1
            self.worst = max(self.worst, took)
            self.slow += took > READYZ_LIMIT_SECONDS
            self._stop_event.wait(max(0.0, 1.0 - took))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=35)


@dataclass
class Result:
    name: str
    ready_rss: int = 0
    peak_rss: int = 0
    bound: int = 0
    worst_readyz: float = 0.0
    slow_readyz: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        found = list(self.notes)
        if self.peak_rss > self.bound:
            found.append(f"peak RSS {self.peak_rss / MiB:.0f} MiB over the bound {self.bound / MiB:.0f} MiB")
        if self.slow_readyz:
            found.append(f"/readyz over {READYZ_LIMIT_SECONDS:g} s {self.slow_readyz} times "
                         f"(worst {self.worst_readyz:.2f} s)")
        return found

    def line(self) -> str:
        return (f"{self.name}: peak RSS {self.peak_rss / MiB:.0f} MiB (ready {self.ready_rss / MiB:.0f} MiB, bound "
                f"{self.bound / MiB:.0f} MiB); worst /readyz {self.worst_readyz:.2f} s ({self.slow_readyz} over "
                f"1 s); {dict(sorted(self.statuses.items()))}")


async def crowd_streams(address: str, data: bytes, streams: int, per_stream: int, seconds: float,
                        channels: int = 8) -> Counter[str]:
    """`streams` streams, each writing `per_stream` requests and never reading; for at most `seconds`, then every
    stream is cancelled. Counts the writes accepted ("sent") and how the streams ended before the cancel."""
    import grpc

    counts: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    opened = [grpc.aio.insecure_channel(address) for _ in range(channels)]
    calls = [opened[i % channels].stream_stream(SERVICE + "ModelStreamInfer")(timeout=seconds + 60)
             for i in range(streams)]

    async def write_all(call: grpc.aio.StreamStreamCall) -> None:
        for _ in range(per_stream):
            try:
                await asyncio.wait_for(call.write(data), max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                counts["write waiting (flow control)"] += 1
                return
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                counts["write refused"] += 1
                return
            counts["sent"] += 1

    try:
        await asyncio.gather(*(write_all(call) for call in calls))
        await asyncio.sleep(max(0.0, min(3.0, deadline - time.monotonic())))  # what the server does with them
        for call in calls:
            if call.done():
                code = await call.code()
                counts[f"stream {code.name}"] += 1
    finally:
        for call in calls:
            call.cancel()
        for channel in opened:
            await channel.close()
    return counts


async def crowd_unary(address: str, data: bytes, calls: int, timeout: float, gzip: bool = False) -> Counter[str]:
    """`calls` concurrent ModelInfer calls of `data`, each on a channel of its own; their status codes."""
    import grpc

    compression = grpc.Compression.Gzip if gzip else None

    async def one() -> str:
        async with grpc.aio.insecure_channel(address, compression=compression,
                                             options=[("grpc.max_receive_message_length", -1)]) as channel:
            try:
                await channel.unary_unary(SERVICE + "ModelInfer")(data, timeout=timeout)
                return "OK"
            except grpc.aio.AioRpcError as exc:
                return exc.code().name

    return Counter(await asyncio.gather(*(one() for _ in range(calls))))


async def crowd_silent(address: str, calls: int, seconds: float) -> Counter[str]:
    """`calls` ModelInfer calls, each on a connection of its own, that send their headers and no message, for
    `seconds`; then each is cancelled. Counts how each had ended by then ("open": it had not)."""
    import grpc

    async def nothing() -> AsyncIterator[bytes]:
        await asyncio.sleep(seconds + 60)
        yield b""

    opened = [grpc.aio.insecure_channel(address, options=[("posenc.crowd.connection", i)]) for i in range(calls)]
    started = [channel.stream_unary(SERVICE + "ModelInfer")(nothing(), timeout=seconds + 60) for channel in opened]
    await asyncio.sleep(seconds)
    counts: Counter[str] = Counter()
    for call in started:
        counts[f"silent call {(await call.code()).name}" if call.done() else "silent call open"] += 1
        call.cancel()
    for channel in opened:
        await channel.close()
    return counts


def http_clients(port: int, stop: threading.Event, counts: Counter[str]) -> list[threading.Thread]:
    """One client asking for TABLE, one posting a 148 KB rope_attention inference (B=1, S=24), until `stop`; each
    answer counted by kind and status."""
    from posenc.service.testing import kserve_request

    infer = kserve_request(attention_inputs(8, 8, 64, 1, 24))
    asks = {"table": ("GET", TABLE, None, {}),
            "infer": ("POST", f"/v2/models/{MODEL}/infer", infer.body, infer.headers)}

    def loop(kind: str) -> None:
        method, path, body, headers = asks[kind]
        while not stop.is_set():
            try:
                conn = http.client.HTTPConnection(LOOPBACK, port, timeout=60)
                conn.request(method, path, body, headers)
                response = conn.getresponse()
                response.read()
                conn.close()
                counts[f"http {kind} {response.status}"] += 1
            except OSError as exc:
                counts[f"http {kind} {type(exc).__name__}"] += 1
            stop.wait(0.05)

    return [threading.Thread(target=loop, args=(kind,), daemon=True) for kind in asks]


async def crowd_large_streams(address: str, data: bytes, streams: int, timeout: float,
                              channels: int = 8) -> Counter[str]:
    """`streams` ModelStreamInfer streams over `channels` connections, each sending `data` once and reading its
    answer; how each request was answered."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    opened = [grpc.aio.insecure_channel(address, options=[("grpc.max_receive_message_length", -1),
                                                          ("posenc.crowd.connection", i)]) for i in range(channels)]

    async def one(index: int) -> str:
        call = opened[index % channels].stream_stream(SERVICE + "ModelStreamInfer")(iter([data]), timeout=timeout)
        try:
            answers = [pb.ModelStreamInferResponse.FromString(answer) async for answer in call]
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
        errors = [answer.error_message.split(":")[0] for answer in answers if answer.error_message]
        return f"answered: {errors[0]}" if errors else f"answered OK x{len(answers)}"

    try:
        return Counter(await asyncio.gather(*(one(i) for i in range(streams))))
    finally:
        for channel in opened:
            await channel.close()


def run_scenario(name: str, settings: Mapping[str, object], *, streams: int = 1000, per_stream: int = 12,
                 calls: int = 32, batch: int = 40, seconds: float = 30.0, env: Mapping[str, str] | None = None
                 ) -> Result:
    """One scenario (`SCENARIOS`) against a fresh server with `settings`."""
    config = {"log_level": "warning", "access_log": False, **settings}
    result = Result(name, bound=memory_bound(Settings(**config)))  # type: ignore[arg-type]
    # streams: rope_attention B=1 S=64 (0.38 MiB); unary: B=batch S=256, 1.5 MiB per batch row (60 MiB for 40)
    data = (b"" if name == "silent" else infer_request(1, 64) if name == "streams"
            else infer_request(batch, 256, zeros=name == "gzip"))
    with ServerProcess(config, cwd=ROOT, ready="/readyz", ready_timeout=120, grpc=True, env=env) as server:
        result.ready_rss = peak_rss(server.pid, "VmRSS")
        sampler = ReadyzSampler(server.port)
        sampler.start()
        stop, answers = threading.Event(), Counter[str]()
        clients = http_clients(server.port, stop, answers) if name == "silent" else []
        try:
            for client in clients:
                client.start()
            if name == "streams":
                work = crowd_streams(server.grpc_address, data, streams, per_stream, seconds)
            elif name == "silent":
                work = crowd_silent(server.grpc_address, calls, seconds)
            elif name == "large-streams":
                work = crowd_large_streams(server.grpc_address, data, calls, seconds + 120)
            else:
                work = crowd_unary(server.grpc_address, data, calls, seconds, gzip=name == "gzip")
            result.statuses = asyncio.run(work)
            stop.set()
            for client in clients:
                client.join()
            result.statuses.update(answers)
            result.notes.extend(f"{count} x {kind}" for kind, count in answers.items() if not kind.endswith(" 200"))
            time.sleep(1.0)
            result.peak_rss = peak_rss(server.pid)
        finally:
            sampler.stop()
        if server.poll() is not None:
            result.notes.append(f"the server exited ({server.poll()})")
    result.worst_readyz, result.slow_readyz = sampler.worst, sampler.slow
    result.notes.extend(sampler.failures[:3])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS), help=f"of {', '.join(SCENARIOS)}")
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--per-stream", type=int, default=12)
    parser.add_argument("--calls", type=int, default=0,
                        help="unary calls or large streams (default: 32, 24 with gzip and large-streams)")
    parser.add_argument("--batch", type=int, default=40, help="batch rows of the unary request (1.5 MiB each)")
    parser.add_argument("--seconds", type=float, default=30.0, help="each scenario's time limit")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a server setting (Settings field), e.g. memory_budget_bytes=67108864")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.set)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario {sorted(unknown)}: choose among {', '.join(SCENARIOS)}")
    failed = False
    for name in args.scenarios:
        calls = args.calls or (24 if name in ("gzip", "large-streams") else 32)
        result = run_scenario(name, settings, streams=args.streams, per_stream=args.per_stream, calls=calls,
                              batch=args.batch, seconds=args.seconds)
        print(result.line(), flush=True)
        for failure in result.failures:
            print(f"  FAIL {failure}", flush=True)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
