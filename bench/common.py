"""Shared helpers of the benchmarks: server subprocesses on loopback, load generators, the results table.

* `Service`: a server in a subprocess on a free loopback port (posenc via `python -m service.cli serve`, or the
  bare-FastAPI anchor via `python -m uvicorn`), its output in a log file, stopped with SIGTERM (then SIGKILL).
* `LoadGen.round`: one fixed-duration load round of N keep-alive connections, each sending the same request as
  fast as it can (closed loop); `wrk -t1` when installed, else a small asyncio HTTP/1.1 client. Both read
  every response body in full and count non-2xx answers and socket errors.
* `Row` / `format_table`: one line per ratio (posenc value, anchor value, ratio, target, PASS/BELOW).
"""

from __future__ import annotations

import asyncio
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The anchor: a bare FastAPI app serving, from `async def` endpoints, the bytes and headers captured from
# posenc (RATIOS_ANCHOR_SPEC names a JSON file: {"raw": {path: {file, media_type, headers}}, "json": {path: obj}}).
ANCHOR_APP = '''
import json, os
from fastapi import FastAPI, Response

app = FastAPI()
SPEC = json.load(open(os.environ["RATIOS_ANCHOR_SPEC"]))


def _raw(content, media_type, headers):
    async def endpoint() -> Response:
        return Response(content=content, media_type=media_type, headers=headers)
    return endpoint


def _json(obj):
    async def endpoint() -> dict:
        return obj
    return endpoint


for path, entry in SPEC["raw"].items():
    with open(entry["file"], "rb") as f:
        app.add_api_route(path, _raw(f.read(), entry["media_type"], entry["headers"]), methods=["GET"])
for path, obj in SPEC["json"].items():
    app.add_api_route(path, _json(obj), methods=["GET"])
'''

# wrk script: request from RATIOS_* variables; `done` prints one machine-readable summary line.
WRK_SCRIPT = r'''
local method = os.getenv("RATIOS_METHOD")
if method and method ~= "" then wrk.method = method end
local body = os.getenv("RATIOS_BODY")
if body and body ~= "" then
  local f = assert(io.open(body, "rb")); wrk.body = f:read("*a"); f:close()
end
for name, value in (os.getenv("RATIOS_HEADERS") or ""):gmatch("([^:\n]+):%s*([^\n]*)") do
  wrk.headers[name] = value
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RATIOS_RESULT %d %d %d %d %d %d %d %d %.1f\n", summary.duration, summary.requests,
    summary.bytes, e.connect, e.read, e.write, e.status, e.timeout, latency:percentile(50)))
end
'''


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_request(port: int, path: str, method: str = "GET", body: bytes | None = None,
                 headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection (no proxy): status, lower-cased headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


class Service:
    """A server subprocess on 127.0.0.1:`port`; stdout and stderr go to `log_path`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, log_dir: Path) -> None:
        self.name, self.port = name, port
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def wait_ready(self, path: str, timeout: float = 90) -> None:
        """Poll `path` until it answers 200; raise (with the log tail) if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if http_request(self.port, path, timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} did not become ready on port {self.port}:\n{tail}")
            time.sleep(0.2)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float = 15) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def posenc_service(name: str, settings: dict[str, str], log_dir: Path) -> Service:
    """`python -m service.cli serve` with POSENC_* = `settings` only (any POSENC_* of this shell is dropped)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSENC_")}
    env.update({f"POSENC_{k.upper()}": v for k, v in settings.items()}, POSENC_PORT=str(port),
               PYTHONPATH=str(ROOT))
    return Service(name, [sys.executable, "-m", "service.cli", "serve"], env, port, log_dir)


def anchor_service(spec_path: Path, app_dir: Path, log_dir: Path) -> Service:
    """The bare FastAPI anchor on uvicorn: uvloop + httptools (what posenc runs on), access log off."""
    (app_dir / "ratios_anchor.py").write_text(ANCHOR_APP)
    port = free_port()
    env = {**os.environ, "RATIOS_ANCHOR_SPEC": str(spec_path)}
    argv = [sys.executable, "-m", "uvicorn", "ratios_anchor:app", "--app-dir", str(app_dir), "--host", "127.0.0.1",
            "--port", str(port), "--loop", "uvloop", "--http", "httptools", "--no-access-log",
            "--log-level", "warning"]
    return Service("anchor", argv, env, port, log_dir)


def stop_all(services: list[Service]) -> None:
    """SIGTERM every server at once, then wait for each (SIGKILL after 15 s)."""
    for service in services:
        service.terminate()
    for service in services:
        service.wait_stopped()


@dataclass
class Target:
    """What a load round sends: one request, repeated."""

    port: int
    path: str
    method: str = "GET"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    body_file: Path | None = None  # the body on disk, for wrk


@dataclass
class LoadResult:
    """One round: completed requests, response bytes, errors (non-2xx or socket), its length, median latency."""

    requests: int
    nbytes: int
    errors: int
    seconds: float
    p50_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def gbps(self) -> float:
        return self.nbytes / self.seconds / 1e9


class LoadGen:
    """Fixed-duration closed-loop load: `wrk -t1 -cN` if available (and not disabled), else asyncio sockets."""

    def __init__(self, work_dir: Path, prefer_wrk: bool = True) -> None:
        self.wrk = shutil.which("wrk") if prefer_wrk else None
        self.script = work_dir / "ratios.lua"
        self.script.write_text(WRK_SCRIPT)

    def describe(self) -> str:
        if not self.wrk:
            return "python asyncio HTTP/1.1 keep-alive client (wrk not found, or --no-wrk)"
        version = subprocess.run([self.wrk, "-v"], capture_output=True, text=True).stdout.split("\n")[0]
        return f"{version.split(' [')[0]} (-t1)"

    def round(self, target: Target, seconds: int, connections: int) -> LoadResult:
        if self.wrk:
            return self._wrk(target, seconds, connections)
        return asyncio.run(_python_load(target, seconds, connections))

    def _wrk(self, target: Target, seconds: int, connections: int) -> LoadResult:
        env = {**os.environ, "RATIOS_METHOD": target.method,
               "RATIOS_BODY": str(target.body_file) if target.body_file else "",
               "RATIOS_HEADERS": "\n".join(f"{k}: {v}" for k, v in target.headers.items())}
        argv = [str(self.wrk), "-t1", f"-c{connections}", f"-d{max(1, seconds)}s", "--timeout", "60s",
                "-s", str(self.script), f"http://127.0.0.1:{target.port}{target.path}"]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=seconds + 120)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RATIOS_RESULT")), None)
        if line is None:
            raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-800:]} {out.stderr[-800:]}")
        us, requests, nbytes, *errors, p50_us = line.split()[1:]
        return LoadResult(int(requests), int(nbytes), sum(int(e) for e in errors), int(us) / 1e6,
                          float(p50_us) / 1000)


async def _one_connection(target: Target, request: bytes, deadline: float, out: list[tuple[float, int, bool]]) -> None:
    """Send `request` over one keep-alive connection until `deadline`; append (latency, bytes, ok) per response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
    try:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            writer.write(request)
            await writer.drain()
            status_line = await reader.readline()
            length, close, nbytes = 0, False, len(status_line)
            while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                nbytes += len(line)
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding":
                    raise RuntimeError("chunked responses are not supported by the fallback client")
                elif name == b"connection" and value.strip().lower() == b"close":
                    close = True
            remaining = length
            while remaining:
                chunk = await reader.read(min(remaining, 1 << 20))
                if not chunk:
                    raise ConnectionError("connection closed mid-body")
                remaining -= len(chunk)
            ok = status_line.split(b" ")[1:2] and status_line.split(b" ")[1].startswith(b"2")
            out.append((time.perf_counter() - start, nbytes + length, bool(ok)))
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", target.port)
    finally:
        writer.close()


async def _python_load(target: Target, seconds: int, connections: int) -> LoadResult:
    head = [f"{target.method} {target.path} HTTP/1.1", f"Host: 127.0.0.1:{target.port}",
            *(f"{k}: {v}" for k, v in target.headers.items())]
    if target.body or target.method == "POST":
        head.append(f"Content-Length: {len(target.body)}")
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + target.body
    results: list[tuple[float, int, bool]] = []
    start = time.perf_counter()
    outcomes = await asyncio.gather(
        *(_one_connection(target, request, start + seconds, results) for _ in range(connections)),
        return_exceptions=True)
    elapsed = time.perf_counter() - start
    socket_errors = sum(isinstance(o, BaseException) for o in outcomes)
    latencies = [r[0] for r in results] or [float("nan")]
    return LoadResult(len(results), sum(r[1] for r in results), socket_errors + sum(not r[2] for r in results),
                      elapsed, 1000 * statistics.median(latencies))


def machine_header() -> list[str]:
    """CPU model, cores, load average and the Python / library versions, as `# ...` lines."""
    import fastapi
    import numpy
    import onnxruntime
    import uvicorn

    model = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    cores = len(os.sched_getaffinity(0))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [f"# machine: {model}, {os.cpu_count()} CPUs ({cores} usable by this process), load average {load}",
            f"# Python {sys.version.split()[0]}, uvicorn {uvicorn.__version__}, fastapi {fastapi.__version__}, "
            f"onnxruntime {onnxruntime.__version__}, numpy {numpy.__version__}"]


@dataclass
class Row:
    """One ratio. `ratio` is oriented so that higher is better for posenc (posenc/anchor for rates,
    anchor/posenc for times); `target` None means informational (no PASS/BELOW)."""

    what: str
    value: float
    anchor: float
    unit: str
    higher_is_better: bool
    target: float | None = None
    note: str = ""
    errors: int = 0

    @property
    def ratio(self) -> float:
        if not self.value or not self.anchor:
            return float("nan")
        return self.value / self.anchor if self.higher_is_better else self.anchor / self.value

    @property
    def status(self) -> str:
        if self.errors:
            return "ERROR"
        if self.target is None:
            return "info"
        return "PASS" if self.ratio >= self.target else "BELOW"


def _num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def format_table(rows: list[Row]) -> str:
    """A fixed-width table; a failing row says BELOW (or ERROR when any request failed)."""
    head = ["what", "posenc", "anchor", "ratio", "target", "status", "note"]
    body = [[r.what, f"{_num(r.value)} {r.unit}", f"{_num(r.anchor)} {r.unit}", f"{r.ratio:.3f}",
             f">= {r.target:.2f}" if r.target is not None else "-", r.status, r.note] for r in rows]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
