"""The mixed crowd: many keep-alive clients asking for large uncached tables, inferences, check uploads and a
small cached table at once, with the server's peak RSS held to its documented bound.

    python scripts/crowd.py [--seconds 45] [--clients 64] [--max-rss-mib N]

Starts `posenc serve` with its default memory settings (POSENC_MEMORY_BUDGET_BYTES, POSENC_CACHE_BYTES),
runs the crowd for `--seconds`, then sends two bodies of `"data":[` repeated and never closed (4 MiB) and
checks each is a 400 within a second of server CPU. Fails (exit 1) on any 5xx other than 503 with
Retry-After, on a pathological body that costs more, and on a peak RSS (VmHWM) over the bound of
docs/operations.md (`memory_bound`): budget + cache + the process's base. `scripts/soak.py --crowd` runs it
as part of the soak.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's service and test kit, whatever the environment has installed

from posenc.service.settings import Settings  # noqa: E402
from posenc.service.testing import (  # noqa: E402
    HttpRequest,
    LoadGenerator,
    Outcome,
    ServerProcess,
    attention_inputs,
    http_request,
    kserve_request,
)

MiB = 1024 * 1024
BASE_MIB = 256  # the process with its models loaded and its threads started (docs/operations.md)
MIX = {"table-16mib": 25, "infer": 35, "check-upload": 20, "table-cached": 20}
CACHED = "/v1/alibi/slopes?num_heads=12&format=json"
CHECKED = "max_position=2048&head_dim=128"  # cos and sin, 1 MiB each
PATHOLOGICAL = b'"data":[' * (4 * MiB // 8)


def memory_bound(settings: Settings) -> int:
    """The documented peak RSS bound: the memory budget, the table cache, what glibc's heaps may keep, the base."""
    kept = settings.malloc_arenas * settings.malloc_keep_bytes
    return settings.memory_budget_bytes + settings.cache_bytes + kept + BASE_MIB * MiB


def peak_rss(pid: int) -> int:
    """VmHWM of process `pid`: the most it has been resident."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_seconds(pid: int) -> float:
    import os
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Crowd:
    def __init__(self, port: int, clients: int, seed: int) -> None:
        self.port = port
        self.rngs = [random.Random(seed * 7919 + index) for index in range(clients)]
        infer = kserve_request(attention_inputs(8, 8, 64, 2, 256, seed=seed), binary_output=True, content_type=True)
        self.infer = HttpRequest("POST", "/v2/models/rope_attention/infer", infer.body, infer.headers, "infer")
        upload = http_request(port, f"/v1/rope?{CHECKED}&format=safetensors", timeout=120)[2]
        self.check = HttpRequest("POST", f"/v1/check/rope?{CHECKED}", upload,
                                 {"Content-Type": "application/octet-stream"}, "check-upload")
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.violations: list[str] = []

    def next_request(self, index: int, step: int) -> HttpRequest:
        rng = self.rngs[index]
        kind = rng.choices(list(MIX), list(MIX.values()))[0]
        if kind == "table-16mib":  # [32768, 128] float32, never asked before
            return HttpRequest("GET", f"/v1/rope?max_position=32768&head_dim=128&offset={rng.randrange(1 << 30)}"
                                      "&format=raw&tensor=cos", label=kind)
        if kind == "table-cached":
            return HttpRequest("GET", CACHED, label=kind)
        return self.infer if kind == "infer" else self.check

    def observe(self, done: Outcome) -> bool:
        status = done.status
        outcome = "no answer" if status is None else "503+Retry-After" if (
            status == 503 and "retry-after" in done.headers) else str(status)
        self.outcomes[done.request.label, outcome] += 1
        if status is None or (status >= 500 and outcome != "503+Retry-After") or 300 <= (status or 0) < 500:
            self.violations.append(f"{done.request.label}: {outcome} {done.error or ''}".strip())
        return True


def run_crowd(server: ServerProcess, seconds: float, clients: int, seed: int = 0) -> tuple[Crowd, float]:
    """The crowd for `seconds`, then the pathological bodies: (the crowd, the bodies' server CPU seconds)."""
    crowd = Crowd(server.port, clients, seed)
    LoadGenerator(server.port, connections=clients, seconds=seconds, timeout=120).run(crowd.next_request,
                                                                                   crowd.observe)
    before = cpu_seconds(server.pid)
    for _ in range(2):
        try:
            status = http_request(server.port, "/v2/models/rope_attention/infer", "POST", PATHOLOGICAL, timeout=30)[0]
        except OSError as exc:  # no answer in time
            crowd.violations.append(f"pathological body: {exc!r}")
            break
        if status != 400:
            crowd.violations.append(f"pathological body: {status}, expected 400")
    return crowd, cpu_seconds(server.pid) - before


def check_crowd(seconds: float, clients: int, seed: int = 0, max_rss: int | None = None) -> list[str]:
    """Run the crowd against a fresh server with the default memory settings: the violations (none: passed)."""
    bound = max_rss or memory_bound(Settings())
    with ServerProcess({"log_level": "warning", "access_log": False}, cwd=ROOT, ready="/readyz",
                       ready_timeout=120) as server:
        start = time.monotonic()
        crowd, pathological_cpu = run_crowd(server, seconds, clients, seed)
        hwm = peak_rss(server.pid)
        log = server.log()
    print(f"\ncrowd: {clients} clients, {time.monotonic() - start:.0f} s")
    for (kind, outcome), count in sorted(crowd.outcomes.items()):
        print(f"  {kind:<14}{outcome:<18}{count:>7}")
    print(f"peak RSS (VmHWM) {hwm / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB; two 4 MiB pathological bodies: "
          f"{pathological_cpu:.2f} s of server CPU")
    violations = list(dict.fromkeys(crowd.violations))
    if hwm > bound:
        violations.append(f"crowd: peak RSS {hwm / MiB:.0f} MiB over the bound {bound / MiB:.0f} MiB")
    if pathological_cpu > 2.0:
        violations.append(f"crowd: the pathological bodies took {pathological_cpu:.2f} s of server CPU")
    return violations + [f"server log: {line}" for line in log.splitlines() if " ERROR " in line][:5]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=45)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-rss-mib", type=float, help="peak RSS bound (default: the documented bound)")
    args = parser.parse_args()
    violations = check_crowd(args.seconds, args.clients, args.seed,
                             int(args.max_rss_mib * MiB) if args.max_rss_mib else None)
    if violations:
        print("FAILED:\n  " + "\n  ".join(violations[:30]))
        return 1
    print("OK: no 5xx, the pathological bodies cheap, RSS within its bound")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
