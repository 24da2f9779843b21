"""The mixed crowds: many clients asking for large uncached tables, inferences, check uploads and a small
cached table at once, with the server's peak RSS held to its documented bound and /healthz answering.

    python scripts/crowd.py [--seconds 45] [--clients 64] [--mix NAME ...] [--max-rss-mib N]

Each mix of `MIXES` runs against a fresh `posenc serve` with its default memory settings
(POSENC_MEMORY_BUDGET_BYTES, POSENC_CACHE_BYTES) for `--seconds` (split between the mixes run), while a
thread of its own asks /healthz once a second on its own connection; then two bodies of `"data":[` repeated
and never closed (4 MiB) are sent, each of which must be a 400 within a second of server CPU. Fails (exit 1)
on any 5xx other than 503 with Retry-After, on a pathological body that costs more, on a /healthz answer
slower than `HEALTH_LIMIT_SECONDS`, and on a peak RSS (VmHWM) over the bound of docs/operations.md
(`memory_bound`): budget + cache + glibc's kept heaps + the process's base. `scripts/soak.py --crowd-seconds`
runs it as part of the soak.
"""

from __future__ import annotations

import argparse
import http.client
import io
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's service and test kit, whatever the environment has installed

from posenc.service.budget import memory_bound  # noqa: E402
from posenc.service.settings import Settings  # noqa: E402
from posenc.service.testing import (  # noqa: E402
    LOOPBACK,
    HttpRequest,
    LoadGenerator,
    Outcome,
    ServerProcess,
    attention_inputs,
    http_request,
    kserve_request,
)

MiB = 1024 * 1024
CACHED = "/v1/alibi/slopes?num_heads=12&format=json"
CHECKED = "max_position=2048&head_dim=128"  # cos and sin, 1 MiB each
PATHOLOGICAL = b'"data":[' * (4 * MiB // 8)
HEALTH_LIMIT_SECONDS = 1.0  # /healthz answers within this at every sample, however busy the server is


@dataclass(frozen=True)
class Mix:
    """A crowd: request kinds by weight, over keep-alive connections or a new connection per request."""

    kinds: dict[str, int]
    new_connections: bool
    what: str


MIXES = {
    # keep-alive clients: uncached [32768, 128] RoPE tables (16 MiB), B=2 S=256 inferences, 2 MiB safetensors
    # uploads checked against RoPE, a cached table
    "keep-alive": Mix({"table-16mib": 25, "infer": 35, "check-upload": 20, "table-cached": 20}, False,
                      "keep-alive connections: 16 MiB tables, inferences, 2 MiB check uploads, a cached table"),
    # clients without a connection pool (each request says Connection: close): uncached [16, 512, 512] ALiBi biases
    # (16 MiB), the same inferences, 8 MiB .npy uploads checked against an ALiBi bias they do not match, small slopes
    "new-connections": Mix({"alibi-16mib": 2, "infer": 2, "check-alibi-8mib": 1, "alibi-slopes": 1}, True,
                           "a new connection per request: 16 MiB ALiBi biases, inferences, 8 MiB .npy checks, "
                           "slopes"),
}


def peak_rss(pid: int, field: str = "VmHWM") -> int:
    """VmHWM of process `pid`: the most it has been resident (`field` VmRSS: what it is now)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    import os
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


class Crowd:
    def __init__(self, port: int, clients: int, seed: int, mix: Mix) -> None:
        self.port = port
        self.mix = mix
        self.rngs = [random.Random(seed * 7919 + index) for index in range(clients)]
        # a client without a connection pool says so: the server closes after each answer, and a refusal given
        # before an upload was read (a 503 of the memory budget) must still reach it as a status, not a reset
        self.closing = {"Connection": "close"} if mix.new_connections else {}
        infer = kserve_request(attention_inputs(8, 8, 64, 2, 256, seed=seed), binary_output=True, content_type=True)
        self.infer = HttpRequest("POST", "/v2/models/rope_attention/infer", infer.body,
                                 {**infer.headers, **self.closing}, "infer")
        self.uploads: dict[str, bytes] = {}
        if "check-upload" in mix.kinds:
            self.uploads["check-upload"] = http_request(port, f"/v1/rope?{CHECKED}&format=safetensors",
                                                        timeout=120)[2]
        if "check-alibi-8mib" in mix.kinds:  # zeros: every head order is ranked against them
            self.uploads["check-alibi-8mib"] = npy_bytes(np.zeros((8, 512, 512), np.float32))
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.violations: list[str] = []

    def next_request(self, index: int, step: int) -> HttpRequest:
        rng = self.rngs[index]
        kind = rng.choices(list(self.mix.kinds), list(self.mix.kinds.values()))[0]
        if kind == "table-16mib":  # [32768, 128] float32, never asked before
            return HttpRequest("GET", f"/v1/rope?max_position=32768&head_dim=128&offset={rng.randrange(1 << 30)}"
                                      "&format=raw&tensor=cos", headers=self.closing, label=kind)
        if kind == "alibi-16mib":  # [16, 512, 512] float32, uncached: alibi_bias_max differs every time
            return HttpRequest("GET", "/v1/alibi/bias?num_heads=16&query_length=512&key_length=512&format=raw"
                                      f"&alibi_bias_max={rng.uniform(1, 8)!r}", headers=self.closing, label=kind)
        if kind == "table-cached":
            return HttpRequest("GET", CACHED, headers=self.closing, label=kind)
        if kind == "alibi-slopes":
            return HttpRequest("GET", "/v1/alibi/slopes?num_heads=8", headers=self.closing, label=kind)
        if kind == "check-upload":
            return HttpRequest("POST", f"/v1/check/rope?{CHECKED}", self.uploads[kind],
                               {"Content-Type": "application/octet-stream", **self.closing}, kind)
        if kind == "check-alibi-8mib":
            return HttpRequest("POST", "/v1/check/alibi/bias?num_heads=8&query_length=512&key_length=512"
                                       f"&alibi_bias_max={rng.choice((8, 4))}", self.uploads[kind],
                               {"Content-Type": "application/octet-stream", **self.closing}, kind)
        return self.infer

    def observe(self, done: Outcome) -> bool:
        status = done.status
        outcome = "no answer" if status is None else "503+Retry-After" if (
            status == 503 and "retry-after" in done.headers) else str(status)
        self.outcomes[done.request.label, outcome] += 1
        if status is None or (status >= 500 and outcome != "503+Retry-After") or 300 <= (status or 0) < 500:
            self.violations.append(f"{done.request.label}: {outcome} {done.error or ''}".strip())
        return True


class HealthSampler(threading.Thread):
    """GET /healthz once a second on a connection of its own while the crowd runs: the worst latency seen."""

    def __init__(self, port: int) -> None:
        super().__init__(name="healthz-sampler", daemon=True)
        self.port = port
        self.done = threading.Event()
        self.samples = 0
        self.worst = 0.0
        self.failures: list[str] = []

    def run(self) -> None:
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=30)
        try:
            while not self.done.wait(1.0):
                start = time.monotonic()
                try:
                    conn.request("GET", "/healthz")
                    response = conn.getresponse()
                    response.read()
                    status = response.status
                except (OSError, http.client.HTTPException) as exc:
                    status = None
                    conn.close()  # reconnects at the next request
                    self.failures.append(f"/healthz: {exc!r}")
                latency = time.monotonic() - start
                self.samples += 1
                self.worst = max(self.worst, latency)
                if status is not None and status != 200:
                    self.failures.append(f"/healthz: {status}")
        finally:
            conn.close()

    def stop(self) -> None:
        self.done.set()
        self.join()


def run_crowd(server: ServerProcess, seconds: float, clients: int, seed: int = 0,
              mix: Mix = MIXES["keep-alive"]) -> tuple[Crowd, HealthSampler, float]:
    """The crowd for `seconds` with /healthz sampled, then the pathological bodies: (the crowd, the sampler,
    the bodies' server CPU seconds)."""
    crowd = Crowd(server.port, clients, seed, mix)
    health = HealthSampler(server.port)
    health.start()
    try:
        LoadGenerator(server.port, connections=clients, seconds=seconds, timeout=120,
                      new_connections=mix.new_connections).run(crowd.next_request, crowd.observe)
    finally:
        health.stop()
    before = cpu_seconds(server.pid)
    for _ in range(2):
        try:
            status = http_request(server.port, "/v2/models/rope_attention/infer", "POST", PATHOLOGICAL, timeout=30)[0]
        except OSError as exc:  # no answer in time
            crowd.violations.append(f"pathological body: {exc!r}")
            break
        if status != 400:
            crowd.violations.append(f"pathological body: {status}, expected 400")
    return crowd, health, cpu_seconds(server.pid) - before


def check_mix(name: str, seconds: float, clients: int, seed: int = 0, max_rss: int | None = None) -> list[str]:
    """Run one mix against a fresh server with the default memory settings: the violations (none: passed)."""
    mix = MIXES[name]
    bound = max_rss or memory_bound(Settings())
    with ServerProcess({"log_level": "warning", "access_log": False}, cwd=ROOT, ready="/readyz",
                       ready_timeout=120) as server:
        start, ready = time.monotonic(), peak_rss(server.pid, "VmRSS")
        crowd, health, pathological_cpu = run_crowd(server, seconds, clients, seed, mix)
        hwm = peak_rss(server.pid)
        log = server.log()
    print(f"\ncrowd '{name}' ({mix.what}): {clients} clients, {time.monotonic() - start:.0f} s")
    for (kind, outcome), count in sorted(crowd.outcomes.items()):
        print(f"  {kind:<18}{outcome:<18}{count:>7}")
    print(f"peak RSS (VmHWM) {hwm / MiB:.0f} MiB ({ready / MiB:.0f} MiB when ready), bound {bound / MiB:.0f} MiB; "
          f"/healthz worst {health.worst:.3f} s over {health.samples} samples; two 4 MiB pathological bodies: "
          f"{pathological_cpu:.2f} s of server CPU")
    violations = [f"crowd '{name}': {line}" for line in dict.fromkeys(crowd.violations + health.failures)]
    if hwm > bound:
        violations.append(f"crowd '{name}': peak RSS {hwm / MiB:.0f} MiB over the bound {bound / MiB:.0f} MiB")
    if health.worst > HEALTH_LIMIT_SECONDS:
        violations.append(f"crowd '{name}': /healthz took {health.worst:.2f} s (at most {HEALTH_LIMIT_SECONDS:g})")
    if pathological_cpu > 2.0:
        violations.append(f"crowd '{name}': the pathological bodies took {pathological_cpu:.2f} s of server CPU")
    return violations + [f"server log: {line}" for line in log.splitlines() if " ERROR " in line][:5]


def check_crowd(seconds: float, clients: int, seed: int = 0, max_rss: int | None = None,
                mixes: tuple[str, ...] = tuple(MIXES)) -> list[str]:
    """Run each of `mixes` for its share of `seconds`, each against a fresh server: the violations."""
    violations = []
    for name in mixes:
        violations += check_mix(name, seconds / len(mixes), clients, seed, max_rss)
    return violations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mix", choices=list(MIXES), nargs="+", default=list(MIXES),
                        help="which crowds to run (default: all, sharing --seconds)")
    parser.add_argument("--max-rss-mib", type=float, help="peak RSS bound (default: the documented bound)")
    args = parser.parse_args()
    violations = check_crowd(args.seconds, args.clients, args.seed,
                             int(args.max_rss_mib * MiB) if args.max_rss_mib else None, tuple(args.mix))
    if violations:
        print("FAILED:\n  " + "\n  ".join(violations[:30]))
        return 1
    print("OK: no 5xx, /healthz within a second, the pathological bodies cheap, RSS within its bound")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
