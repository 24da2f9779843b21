"""What gRPC core buffers is bounded (issue 55, item 3): a real `posenc serve`, its peak resident size (VmHWM) and
/readyz sampled every second on a connection of its own, under

* streams: many `ModelStreamInfer` streams (default 1,000 × 12 requests of 0.38 MiB, from a few channels), whose
  answers are never read;
* large: concurrent large unary `ModelInfer` calls (default 32 × 60 MiB);
* gzip: the same, gzip-compressed (24 × 60 MiB of zeros, about 60 kB each on the wire).

Each scenario runs on a fresh server (VmHWM is the process's lifetime peak). Exit 1 when a peak is over the bound of
docs/operations.md "Memory" (`posenc.service.budget.memory_bound`) or /readyz took over 1 s.

    .venv/bin/python scripts/grpc_crowd.py                 # all three, the issue's sizes
    .venv/bin/python scripts/grpc_crowd.py streams --streams 200 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
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
SCENARIOS = ("streams", "large", "gzip")


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


def run_scenario(name: str, settings: Mapping[str, object], *, streams: int = 1000, per_stream: int = 12,
                 calls: int = 32, batch: int = 40, seconds: float = 30.0, env: Mapping[str, str] | None = None
                 ) -> Result:
    """One scenario (`SCENARIOS`) against a fresh server with `settings`."""
    config = {"log_level": "warning", "access_log": False, **settings}
    result = Result(name, bound=memory_bound(Settings(**config)))  # type: ignore[arg-type]
    # streams: rope_attention B=1 S=64 (0.38 MiB); unary: B=batch S=256, 1.5 MiB per batch row (60 MiB for 40)
    data = infer_request(1, 64) if name == "streams" else infer_request(batch, 256, zeros=name == "gzip")
    with ServerProcess(config, cwd=ROOT, ready="/readyz", ready_timeout=120, grpc=True, env=env) as server:
        result.ready_rss = peak_rss(server.pid, "VmRSS")
        sampler = ReadyzSampler(server.port)
        sampler.start()
        try:
            if name == "streams":
                work = crowd_streams(server.grpc_address, data, streams, per_stream, seconds)
            else:
                work = crowd_unary(server.grpc_address, data, calls, seconds, gzip=name == "gzip")
            result.statuses = asyncio.run(work)
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
    parser.add_argument("--calls", type=int, default=0, help="unary calls (default: 32, 24 with gzip)")
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
        calls = args.calls or (24 if name == "gzip" else 32)
        result = run_scenario(name, settings, streams=args.streams, per_stream=args.per_stream, calls=calls,
                              batch=args.batch, seconds=args.seconds)
        print(result.line(), flush=True)
        for failure in result.failures:
            print(f"  FAIL {failure}", flush=True)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
