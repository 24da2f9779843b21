"""Print the runtime requirements of pyproject.toml, one per line, for the container build.

The dependency list lives in one place (pyproject's `[project].dependencies`); this only swaps the
onnxruntime distribution for the one chosen at build time, keeping its version bounds:

    python3 scripts/runtime_requirements.py pyproject.toml onnxruntime-gpu > requirements.txt

Exactly one of `onnxruntime` / `onnxruntime-gpu` (extras allowed) ends up in the list (both would fight over the same
`onnxruntime` import package).
"""

import re
import sys
import tomllib

RUNTIMES = ("onnxruntime", "onnxruntime-gpu")
NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalized(requirement: str) -> str:
    """PEP 503 name of a requirement string (`onnxruntime_gpu>=1` -> `onnxruntime-gpu`)."""
    match = NAME.match(requirement)
    return re.sub(r"[-_.]+", "-", match.group(1)).lower() if match else ""


def runtime_requirements_name_check(runtime: str) -> None:
    """Refuse anything but onnxruntime / onnxruntime-gpu with optional extras (the build arg is free text)."""
    if normalized(runtime) not in RUNTIMES or not re.fullmatch(r"[A-Za-z0-9._-]+(\[[A-Za-z0-9_,-]+\])?", runtime):
        raise SystemExit(f"ONNXRUNTIME must be one of {', '.join(RUNTIMES)}, optionally with extras "
                         f"such as onnxruntime-gpu[cuda,cudnn] (got {runtime!r})")


def runtime_requirements(pyproject: str, runtime: str) -> list[str]:
    """pyproject's dependencies with the onnxruntime entry swapped for `runtime`.

    `runtime` is `onnxruntime` or `onnxruntime-gpu`, optionally with extras
    (`onnxruntime-gpu[cuda,cudnn]` also installs NVIDIA's CUDA and cuDNN wheels).
    """
    runtime_requirements_name_check(runtime)
    with open(pyproject, "rb") as fh:
        deps: list[str] = tomllib.load(fh)["project"]["dependencies"]
    out = []
    for dep in (d.strip() for d in deps):
        match = NAME.match(dep)
        if match and normalized(dep) in RUNTIMES:
            # Same bounds, chosen distribution: "onnxruntime>=1.22" -> "onnxruntime-gpu>=1.22".
            out.append(runtime + dep[match.end():])
        else:
            out.append(dep)
    if not any(normalized(d) == normalized(runtime) for d in out):
        out.append(runtime)
    return out


def lock_path(runtime: str) -> str:
    """The lock file of an image flavour, relative to the repository (`onnxruntime-gpu[cuda,cudnn]` ->
    `requirements/onnxruntime-gpu-cuda-cudnn.txt`); scripts/lock.py writes it, the Dockerfile installs it."""
    runtime_requirements_name_check(runtime)
    return "requirements/" + re.sub(r"[\[\],]+", "-", runtime).strip("-") + ".txt"


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--lock":
        print(lock_path(sys.argv[2]))
    elif len(sys.argv) == 3:
        print("\n".join(runtime_requirements(sys.argv[1], sys.argv[2])))
    else:
        raise SystemExit("usage: runtime_requirements.py PYPROJECT RUNTIME | --lock RUNTIME  "
                         "(RUNTIME: onnxruntime or onnxruntime-gpu, optionally with extras)")
