"""The calibration's timing runs (`posenc.service.inference.runtime.calibration.time_graphs`) in a child process.

Timing every CPU graph of a model up to S=1024 grows each of its sessions' buffers to that length's attention
(for a 32-head model about 130 MB a graph): done in the serving process, the arenas and heaps stayed resident
for the life of the process (2.1 GB idle after a first start with 2 intra-op threads, against 143 MB from the
cache), and the start-up peak passed a 2 GiB container limit. A child process per model builds its own sessions
from the model's files, times them, prints the timings as one JSON line, and exits: the kernel takes back all
it used. The serving process builds only the sessions of the graphs its rule names, and never runs the others.

    python -I -c "<CHILD_START>" <folder holding posenc> < request.json

The request: {"graphs": {file: path}, "inputs": [[name, datatype, shape, sequence axis], ...], "threads": N,
"seconds": the time left, "parent": the parent's pid}. The answer (stdout): {"sequences": [...], "seconds":
{file: [best seconds per length, null where not timed]}, "peak_bytes": the child's VmHWM}, or {"timings": null}
when the time ran out. The child dies with its parent (PR_SET_PDEATHSIG), so a killed server leaves no
calibration behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("posenc.inference.calibration")

# What one child may hold at its peak: Python, numpy and onnxruntime (about 95 MB), every CPU graph's session of
# one model, and their arenas grown to the runs at S=1024 (the attention scores and their softmax, 2 × [1, H, S, S]
# float32 in each graph that is still timed there): measured 250-810 MB for the shipped models with 2 intra-op
# threads, the most for the 32-head ones (809 MiB with onnxruntime 1.24.1, the lowest version allowed; 700 MB with
# later ones), so a tenth more is reserved. The serving process reserves it in the memory budget while the child
# runs, so the process's bound (docs/operations.md) holds during a first start too; a child past it is logged,
# and the tests check the shipped models against it.
CHILD_BYTES = 896 * 1024 * 1024
# The child's own start (Python, numpy, onnxruntime imports, the sessions) beyond the time given to its timings.
START_SECONDS = 15.0
PR_SET_PDEATHSIG = 1
# (name, KServe datatype, shape with -1 for dynamic dims, the sequence axis) of one model input
InputShape = tuple[str, str, Sequence[int], int | None]

# The child's interpreter is isolated (-I: no PYTHONPATH nor other PYTHON* variable, no user site, and not the working
# directory on sys.path: a json.py where the server was started must not run in the child), starts in CHILD_CWD, and
# finds posenc as its parent does (an editable install's finder is a .pth hook of site-packages, which -I keeps) or
# else in the folder that holds the parent's `posenc`, appended after the standard library (installs found through
# PYTHONPATH or the user site).
CHILD_START = "import sys; sys.path.append(sys.argv.pop(1)); from {module} import main; sys.exit(main())"
CHILD_CWD = "/"
# The environment it gets: what runs the interpreter and its libraries, and the variables that change how
# onnxruntime, OpenMP and the allocator run the timed graphs (so they run as they would in the server). Nothing
# else: the child reads no POSENC_* variable (its request comes on stdin).
CHILD_VARIABLES = frozenset({"PATH", "LD_LIBRARY_PATH", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "GLIBC_TUNABLES"})
CHILD_VARIABLE_PREFIXES = ("ORT_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "MALLOC_")

_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


def measure_apart(graphs: Mapping[str, Path], inputs: Sequence[InputShape], threads: int, deadline: float) -> Any:
    """Time `graphs` (path by file, model.onnx first) in a child process until `deadline` (time.monotonic): a
    `Timings`, or None when the time ran out or the child failed (logged)."""
    from posenc.service.inference.runtime.calibration import Timings

    answer = run_child(graphs, inputs, threads, deadline - time.monotonic())
    if answer is None or answer.get("timings", True) is None:
        return None
    try:
        return Timings(tuple(int(s) for s in answer["sequences"]),
                       {str(file): tuple(math.inf if t is None else float(t) for t in values)
                        for file, values in answer["seconds"].items()})
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("the calibration child's answer is not usable (%s)", exc)
        return None


def run_child(graphs: Mapping[str, Path], inputs: Sequence[InputShape], threads: int,
              seconds: float) -> dict[str, Any] | None:
    """The child's answer (module docstring) for timings bounded by `seconds`; None when there is no time, or
    the child ran past it (killed) or failed (logged)."""
    if seconds <= 0:
        return None
    request = {"graphs": {file: os.path.abspath(path) for file, path in graphs.items()},  # (the child runs in /)
               "inputs": [[name, datatype, list(shape), axis] for name, datatype, shape, axis in inputs],
               "threads": threads, "seconds": seconds, "parent": os.getpid()}
    process = subprocess.Popen(child_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=CHILD_CWD, env=child_environment(os.environ))
    with _running_lock:
        _running.add(process)
    try:
        out, err = process.communicate(json.dumps(request).encode(), timeout=seconds + START_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        log.warning("calibration child %d ran past its %.0f s: killed", process.pid, seconds + START_SECONDS)
        return None
    finally:
        with _running_lock:
            _running.discard(process)
    if process.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {process.returncode}"]
        log.warning("calibration child %d failed: %s", process.pid, tail[0])
        return None
    try:
        answer = json.loads(out)
    except ValueError as exc:
        log.warning("calibration child %d answered no JSON (%s)", process.pid, exc)
        return None
    if not isinstance(answer, dict):
        return None
    peak = answer.get("peak_bytes", 0)
    level = logging.WARNING if isinstance(peak, int) and peak > CHILD_BYTES else logging.INFO
    log.log(level, "calibration child %d: peak %.0f MiB (%.0f MiB reserved for it)", process.pid,
            peak / 2**20 if isinstance(peak, int) else 0, CHILD_BYTES / 2**20)
    return answer


def child_command() -> list[str]:
    """The child's command line (CHILD_START)."""
    package = sys.modules[__name__.partition(".")[0]]  # `posenc`: imported with this module, its parent package
    root = str(Path(str(package.__file__)).resolve().parent.parent)
    return [sys.executable, "-I", "-c", CHILD_START.format(module=__name__), root]


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` the child gets (CHILD_VARIABLES, CHILD_VARIABLE_PREFIXES)."""
    return {name: value for name, value in environ.items()
            if name in CHILD_VARIABLES or name.startswith(CHILD_VARIABLE_PREFIXES)}


def stop_children() -> None:
    """Kill every calibration child still running (the server is stopping)."""
    with _running_lock:
        for process in _running:
            process.kill()


def peak_bytes() -> int:
    """This process's VmHWM: the most it has been resident."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _die_with(parent: int) -> None:
    """SIGKILL this process when its parent dies (Linux), and exit now if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(1)


def main() -> int:
    request = json.loads(sys.stdin.read())
    _die_with(int(request["parent"]))
    from posenc.service.inference.runtime.calibration import measuring_sessions, time_graphs

    deadline = time.monotonic() + float(request["seconds"])
    sessions = measuring_sessions(request["graphs"], int(request["threads"]))
    inputs = [(name, datatype, shape, axis) for name, datatype, shape, axis in request["inputs"]]
    timings = time_graphs(sessions, inputs, deadline)
    if timings is None:
        answer: dict[str, Any] = {"timings": None}
    else:
        answer = {"sequences": list(timings.sequences),
                  "seconds": {file: [t if math.isfinite(t) else None for t in values]
                              for file, values in timings.seconds.items()}}
    answer["peak_bytes"] = peak_bytes()
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
