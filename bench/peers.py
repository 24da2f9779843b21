"""The peers of `bench infer`: other servers of the same graph behind the same client.

KServe's Python ModelServer (bench/kserve_peer.py) runs in a virtual environment of its own, `.venv-bench-kserve`
at the top of the checkout (BENCH_KSERVE_PYTHON names another interpreter): kserve pins a protobuf older than the
one tritonclient needs. It is made on first use with bench/kserve-requirements.txt and the onnxruntime version
this interpreter runs, so both servers run the same onnxruntime.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnxruntime

from bench.harness import ROOT, Servers, log, model_config, repository
from posenc.models.graph_rule import cpu_forms_of
from posenc.service.testing import ServerProcess

KSERVE_VENV = ROOT / ".venv-bench-kserve"
KSERVE_REQUIREMENTS = ROOT / "bench" / "kserve-requirements.txt"


def kserve_python(create: bool) -> tuple[Path | None, str]:
    """(interpreter, why not): KServe's environment, made when missing and `create`."""
    named = os.environ.get("BENCH_KSERVE_PYTHON")
    python = Path(named) if named else KSERVE_VENV / "bin" / "python"
    if _has_kserve(python):
        return python, ""
    if named or not create:
        return None, f"no kserve at {python} (python -m bench infer without --quick makes {KSERVE_VENV.name})"
    log(f"making {KSERVE_VENV.name}: kserve and onnxruntime {onnxruntime.__version__} (once)")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(KSERVE_VENV)], check=True, capture_output=True, timeout=120)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                        str(KSERVE_REQUIREMENTS), f"onnxruntime=={onnxruntime.__version__}"],
                       check=True, capture_output=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        detail = exc.stderr.decode(errors="replace")[-300:] if isinstance(exc.stderr, bytes) else str(exc)
        return None, f"could not install kserve in {KSERVE_VENV.name}: {detail}"
    return (python, "") if _has_kserve(python) else (None, f"kserve did not install in {KSERVE_VENV.name}")


def _has_kserve(python: Path) -> bool:
    if not python.exists():
        return False
    check = subprocess.run([str(python), "-c", "import kserve, onnxruntime; print(onnxruntime.__version__)"],
                           capture_output=True, text=True, timeout=120)
    return check.returncode == 0 and check.stdout.strip() == onnxruntime.__version__


def start_kserve(servers: Servers, python: Path, models: list[str], threads: int) -> ServerProcess:
    """KServe's ModelServer on the servers' CPUs, serving `models` as posenc serves them (graph by sequence)."""
    command = [str(python), str(ROOT / "bench" / "kserve_peer.py"), "--port", "{port}", "--threads", str(threads)]
    for model in models:
        rule = cpu_forms_of(model_config(model))[1]
        folder = str(repository() / model)
        command += ["--model-dir", folder + ("@" + ",".join(f"{file}:{start}" for start, file in rule) if rule else "")]
    return servers.start("KServe ModelServer", command=command)
