"""The peers of `bench infer`: other servers of the same graph behind the same client.

Each runs in a virtual environment of its own at the top of the checkout, made on first use with its requirement
file under bench/ and the onnxruntime version this interpreter runs, so every server runs the same onnxruntime
(BENCH_<NAME>_PYTHON names another interpreter, which is never made):
* KServe's Python ModelServer (bench/kserve_peer.py), `.venv-bench-kserve`, bench/kserve-requirements.txt: kserve
  pins a protobuf older than the one tritonclient needs;
* NVIDIA PyTriton (bench/pytriton_peer.py), `.venv-bench-pytriton`, bench/pytriton-requirements.txt: its wheel
  brings Triton's server and pins numpy below 2;
* LitServe (bench/litserve_peer.py), `.venv-bench-litserve`, bench/litserve-requirements.txt.
A folder this module makes holds a `.gitignore` of `*`, so git leaves it out whatever the checkout's own ignores.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import onnxruntime

from bench.harness import ROOT, Servers, log, model_config, repository
from posenc.models.graph_rule import cpu_forms_of
from posenc.service.testing import ServerProcess, free_port


@dataclass(frozen=True)
class Peer:
    """A peer server's environment: `key` names its folder, requirement file and variable; `module` proves it."""

    name: str
    key: str
    module: str

    @property
    def venv(self) -> Path:
        return ROOT / f".venv-bench-{self.key}"

    @property
    def requirements(self) -> Path:
        return ROOT / "bench" / f"{self.key}-requirements.txt"

    @property
    def variable(self) -> str:
        return f"BENCH_{self.key.upper()}_PYTHON"


KSERVE = Peer("KServe ModelServer", "kserve", "kserve")
PYTRITON = Peer("PyTriton", "pytriton", "pytriton")
LITSERVE = Peer("LitServe", "litserve", "litserve")
KSERVE_VENV, KSERVE_REQUIREMENTS = KSERVE.venv, KSERVE.requirements
INSTALL_TIMEOUT_S = 900


def peer_python(peer: Peer, create: bool) -> tuple[Path | None, str]:
    """(interpreter, why not): the peer's environment, made when missing and `create`."""
    named = os.environ.get(peer.variable)
    python = Path(named) if named else peer.venv / "bin" / "python"
    if _has(python, peer.module):
        return python, ""
    if named or not create:
        return None, (f"no {peer.module} at {python} (python -m bench infer without --quick makes "
                      f"{peer.venv.name})")
    log(f"making {peer.venv.name}: {peer.requirements.name} and onnxruntime {onnxruntime.__version__} (once)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(peer.venv)], check=True, capture_output=True, timeout=120)
        (peer.venv / ".gitignore").write_text("# made by bench/peers.py\n*\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                        str(peer.requirements), f"onnxruntime=={onnxruntime.__version__}"],
                       check=True, capture_output=True, timeout=INSTALL_TIMEOUT_S)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        stderr = getattr(exc, "stderr", None)
        detail = stderr.decode(errors="replace")[-300:] if isinstance(stderr, bytes) else str(exc)
        return None, f"could not install {peer.requirements.name} in {peer.venv.name}: {detail.strip()}"
    return (python, "") if _has(python, peer.module) else (None, f"{peer.module} did not install in {peer.venv.name}")


def kserve_python(create: bool) -> tuple[Path | None, str]:
    """(interpreter, why not): KServe's environment, made when missing and `create`."""
    return peer_python(KSERVE, create)


def _has(python: Path, module: str) -> bool:
    if not python.exists():
        return False
    check = subprocess.run([str(python), "-c", f"import {module}, onnxruntime; print(onnxruntime.__version__)"],
                           capture_output=True, text=True, timeout=120)
    return check.returncode == 0 and check.stdout.strip().endswith(onnxruntime.__version__)


def model_dirs(models: list[str]) -> list[str]:
    """`--model-dir FOLDER@FILE:N,...` per model: the run's repository and each model's calibrated CPU rule."""
    arguments = []
    for model in models:
        rule = cpu_forms_of(model_config(model))[1]
        folder = str(repository() / model)
        steps = ",".join(f"{file}:{start}" for start, file in rule)
        arguments += ["--model-dir", folder + (f"@{steps}" if steps else "")]
    return arguments


def start_kserve(servers: Servers, python: Path, models: list[str], threads: int) -> ServerProcess:
    """KServe's ModelServer on the servers' CPUs, serving `models` as posenc serves them (graph by sequence)."""
    command = [str(python), str(ROOT / "bench" / "kserve_peer.py"), "--port", "{port}", "--threads", str(threads)]
    return servers.start("KServe ModelServer", command=command + model_dirs(models))


def start_pytriton(servers: Servers, python: Path, models: list[str], threads: int) -> ServerProcess:
    """PyTriton on the servers' CPUs (HTTP on the server's port, gRPC on `grpc_address`), ready to infer."""
    grpc_port = free_port()
    command = [str(python), "-m", "bench.pytriton_peer", "--http-port", "{port}", "--grpc-port", str(grpc_port),
               "--threads", str(threads), *model_dirs(models)]
    server = servers.start("PyTriton", {"grpc_port": grpc_port}, command=command)
    for model in models:  # Triton answers /v2/health/ready before PyTriton has bound its models
        server.wait_ready(f"/v2/models/{model}/ready", timeout=180)
    return server


def start_litserve(servers: Servers, python: Path, models: list[str], threads: int) -> ServerProcess:
    """LitServe on the servers' CPUs, its inference workers set up."""
    command = [str(python), "-m", "bench.litserve_peer", "--port", "{port}", "--threads", str(threads),
               *model_dirs(models)]
    server = servers.start("LitServe", command=command)
    server.wait_ready("/health", timeout=180)
    return server
