"""The image run as the Kubernetes manifest runs it, from the outside: a pod-shaped container.

    python scripts/container_pod_check.py ENGINE IMAGE [--crowd-seconds 30]

Reads deploy/kubernetes/base/ (the Deployment's memory limit, uid, read-only root and /tmp emptyDir size, the
ConfigMap's settings, with free ports in place of 8000/8001) and runs the image with `--memory`, `--read-only`,
`--tmpfs /tmp`, `--user`, on the host network:

1. a first start on a fresh /tmp: the port opens within PORT_SECONDS of the container's start, every model is
   ready within the startup probe's window (the first start calibrates), never OOM-killed, the idle process within
   the documented base (`posenc.service.budget.BASE_BYTES`);
2. the crowd of `scripts/crowd.py` (a new connection per request) against it: its peak (VmHWM) under the bound of
   its settings (`memory_bound`), /healthz within a second at every sample, no 5xx but 503 with Retry-After;
3. a restart of the container (its /tmp is a fresh tmpfs again: the start calibrates again), as (1);
4. a new container with the rules of the first start mounted read-only where POSENC_CALIBRATION_RULES reads them
   (the ConfigMap of deploy/kubernetes/overlays/calibrated): ready in seconds, measuring nothing.

Exit status 0 = every check passed; each failure is one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from posenc.service.budget import BASE_BYTES, memory_bound  # noqa: E402
from posenc.service.settings import Settings  # noqa: E402
from posenc.service.testing import free_port  # noqa: E402

PORT_SECONDS = 2.0  # from `run -d` returning to the port accepting: Python's imports, no model loaded yet
RULES_READY_SECONDS = 10.0  # a start whose rules are known builds its sessions only
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
MiB = 2**20
FAILURES: list[str] = []


def fail(message: str) -> None:
    FAILURES.append(message)
    print(f"  FAIL: {message}", file=sys.stderr, flush=True)


def say(message: str) -> None:
    print(f"  {message}", flush=True)


def quantity(text: str) -> int:
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", str(text))
    if match is None:
        raise ValueError(f"unexpected quantity {text}")
    return int(match[1]) * UNITS.get(match[2] or "", 1)


class Pod:
    """The manifest's container settings, and the engine commands that run the image with them."""

    def __init__(self, engine: str, image: str) -> None:
        base = ROOT / "deploy" / "kubernetes" / "base"
        deployment = yaml.safe_load((base / "deployment.yaml").read_text())
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        self.engine, self.image = engine, image
        self.memory = quantity(container["resources"]["limits"]["memory"])
        self.user = spec["securityContext"]["runAsUser"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        (tmp,) = [v for v in spec["volumes"] if v["name"] == "tmp"]
        self.tmp_bytes = quantity(tmp["emptyDir"]["sizeLimit"])
        self.startup_seconds = container["startupProbe"]["periodSeconds"] * container["startupProbe"][
            "failureThreshold"]
        self.port, self.grpc_port = free_port(), free_port()
        self.env: dict[str, str] = dict(yaml.safe_load((base / "configmap.yaml").read_text())["data"])
        self.env.update(POSENC_PORT=str(self.port), POSENC_GRPC_PORT=str(self.grpc_port))
        self.settings = Settings(**{k.removeprefix("POSENC_").lower(): v for k, v in self.env.items()})
        self.names: list[str] = []

    def run(self, name: str, *extra: str) -> float:
        """Start a container; the time `run -d` returned (time.monotonic)."""
        args = [self.engine, "run", "-d", "--name", name, "--network", "host", "--memory", str(self.memory),
                "--memory-swap", str(self.memory), "--read-only", "--tmpfs", f"/tmp:rw,size={self.tmp_bytes},mode=1777",
                "--user", str(self.user), *extra]
        for key, value in self.env.items():
            args += ["-e", f"{key}={value}"]
        subprocess.run([*args, self.image], check=True, capture_output=True, timeout=120)
        self.names.append(name)
        return time.monotonic()

    def engine_out(self, *args: str, timeout: float = 60) -> str:
        done = subprocess.run([self.engine, *args], capture_output=True, text=True, timeout=timeout)
        return done.stdout

    def state(self, name: str) -> dict[str, Any]:
        running, oom, code = self.engine_out("inspect", "--format",
                                             "{{.State.Running}} {{.State.OOMKilled}} {{.State.ExitCode}}",
                                             name).split()
        return {"running": running == "true", "oom_killed": oom == "true", "exit": int(code)}

    def status(self, name: str) -> dict[str, int]:
        """VmRSS and VmHWM of the server (PID 1 of the container), in bytes."""
        text = self.engine_out("exec", name, "cat", "/proc/1/status")
        return {key: int(value.split()[0]) * 1024 for key, value in
                (line.split(":", 1) for line in text.splitlines() if line.startswith(("VmRSS", "VmHWM")))}

    def logs(self, name: str) -> str:
        done = subprocess.run([self.engine, "logs", name], capture_output=True, text=True, timeout=60)
        return done.stdout + done.stderr

    def remove_all(self) -> None:
        for name in self.names:
            subprocess.run([self.engine, "rm", "-f", name], capture_output=True, timeout=60)


def wait_port(port: int, started: float, limit: float) -> float | None:
    while time.monotonic() - started < limit:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return time.monotonic() - started
        except OSError:
            time.sleep(0.01)
    return None


def wait_ready(port: int, started: float, limit: float) -> float | None:
    while time.monotonic() - started < limit:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            time.sleep(0.1)
    return None


def check_start(pod: Pod, name: str, started: float, what: str, ready_limit: float) -> None:
    opened = wait_port(pod.port, started, 30)
    if opened is None or opened > PORT_SECONDS:
        fail(f"{what}: the port opened after {opened} s (at most {PORT_SECONDS} s)")
    ready = wait_ready(pod.port, started, ready_limit)
    state = pod.state(name)
    say(f"{what}: port open after {opened if opened is None else round(opened, 2)} s, ready after "
        f"{ready if ready is None else round(ready, 1)} s, {state}")
    if ready is None:
        fail(f"{what}: not ready within {ready_limit:g} s; log tail: {pod.logs(name)[-1500:]}")
    if state["oom_killed"] or not state["running"]:
        fail(f"{what}: the container was killed ({state})")
        return
    time.sleep(1)
    rss = pod.status(name)
    say(f"{what}: idle VmRSS {rss['VmRSS'] / MiB:.0f} MiB, VmHWM {rss['VmHWM'] / MiB:.0f} MiB")
    if rss["VmRSS"] > BASE_BYTES:
        fail(f"{what}: idle VmRSS {rss['VmRSS'] / MiB:.0f} MiB over the documented base {BASE_BYTES / MiB:.0f} MiB")


def check_crowd(pod: Pod, name: str, seconds: float) -> None:
    """The new-connection crowd of scripts/crowd.py against the container (its server seen from the host by PID)."""
    from types import SimpleNamespace

    from crowd import HEALTH_LIMIT_SECONDS, MIXES, peak_rss, run_crowd  # scripts/crowd.py, beside this file

    bound = memory_bound(pod.settings)
    server = SimpleNamespace(port=pod.port, pid=int(pod.engine_out("inspect", "--format", "{{.State.Pid}}", name)))
    crowd, health, pathological_cpu = run_crowd(server, seconds, 64, mix=MIXES["new-connections"])  # type: ignore[arg-type]
    hwm, state = peak_rss(server.pid), pod.state(name)
    outcomes = ", ".join(f"{kind} {outcome} {count}" for (kind, outcome), count in sorted(crowd.outcomes.items()))
    say(f"crowd: {outcomes}")
    say(f"crowd: peak VmHWM {hwm / MiB:.0f} MiB (bound {bound / MiB:.0f} MiB, limit {pod.memory / MiB:.0f} MiB); "
        f"/healthz worst {health.worst:.3f} s over {health.samples} samples; {state}")
    for violation in dict.fromkeys(crowd.violations + health.failures):
        fail(f"crowd: {violation}")
    if hwm > bound:
        fail(f"crowd: peak VmHWM {hwm / MiB:.0f} MiB over the bound {bound / MiB:.0f} MiB")
    if health.worst > HEALTH_LIMIT_SECONDS:
        fail(f"crowd: /healthz took {health.worst:.2f} s (at most {HEALTH_LIMIT_SECONDS:g} s)")
    if pathological_cpu > 2.0:
        fail(f"crowd: the pathological bodies took {pathological_cpu:.2f} s of server CPU")
    if state["oom_killed"] or not state["running"]:
        fail(f"crowd: the container was killed ({state})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("engine")
    parser.add_argument("image")
    parser.add_argument("--crowd-seconds", type=float, default=30)
    args = parser.parse_args()
    pod = Pod(args.engine, args.image)
    prefix = f"posenc-pod-{os.getpid()}"
    say(f"pod: --memory {pod.memory / MiB:.0f} MiB, --user {pod.user}, --read-only, --tmpfs /tmp "
        f"({pod.tmp_bytes / MiB:.0f} MiB); ports {pod.port}/{pod.grpc_port}; startup window {pod.startup_seconds} s")
    work = Path(tempfile.mkdtemp(prefix="posenc-pod-"))
    try:
        first = f"{prefix}-first"
        check_start(pod, first, pod.run(first), "first start", pod.startup_seconds)
        if "calibrated on this machine" not in pod.logs(first):
            fail("first start: no model was calibrated (a fresh /tmp must measure)")
        if args.crowd_seconds > 0 and not FAILURES:
            check_crowd(pod, first, args.crowd_seconds)
        rules = work / "calibration.json"
        subprocess.run([pod.engine, "cp", f"{first}:/tmp/posenc/calibration.json", str(rules)], check=True,
                       capture_output=True, timeout=60)
        rules.chmod(0o644)  # as a ConfigMap's file: root's, readable by the pod's user
        restarted = time.monotonic()
        subprocess.run([pod.engine, "restart", "-t", "10", first], check=True, capture_output=True, timeout=120)
        check_start(pod, first, restarted, "restart", pod.startup_seconds)
        subprocess.run([pod.engine, "rm", "-f", first], capture_output=True, timeout=60)
        known = f"{prefix}-rules"
        started = pod.run(known, "-v", f"{rules}:{pod.settings.calibration_rules}:ro")
        check_start(pod, known, started, "start with the node type's rules", RULES_READY_SECONDS)
        log = pod.logs(known)
        if "POSENC_CALIBRATION_RULES" not in log or "calibrated on this machine" in log:
            fail(f"start with the node type's rules: measured instead of reading them; log tail: {log[-1500:]}")
    finally:
        pod.remove_all()
    print(f"pod checks: {len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
