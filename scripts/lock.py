"""Write the container's lock files: every runtime package pinned to one version, with its hashes.

    python3 scripts/lock.py           # after changing [project].dependencies in pyproject.toml

One lock per onnxruntime flavour the image can be built with (`requirements/<flavour>.txt`), each resolved by
`uv pip compile --universal` from pyproject's runtime dependencies (scripts/runtime_requirements.py), so that a
rebuild installs the same stack on any Python >= 3.11 and CPU architecture. The first line of each lock records
the digest of the requirements it was resolved from: tests/deploy/test_lock.py fails when pyproject changed
and the locks did not.
"""

import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime_requirements import lock_path, runtime_requirements

REPO = Path(__file__).resolve().parents[1]
FLAVOURS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-gpu[cuda,cudnn]")
DIGEST_PREFIX = "# requirements sha256: "


def requirements_digest(requirements: list[str]) -> str:
    """sha256 of the requirement lines a lock is resolved from (the staleness check compares it)."""
    return hashlib.sha256("\n".join(requirements).encode()).hexdigest()


def uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).exists():
        raise SystemExit("scripts/lock.py needs uv (pip install uv)")
    return found


def lock(flavour: str) -> Path:
    requirements = runtime_requirements(str(REPO / "pyproject.toml"), flavour)
    out = REPO / lock_path(flavour)
    out.parent.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".in") as src:
        src.write("\n".join(requirements) + "\n")
        src.flush()
        resolved = subprocess.run(
            [uv(), "pip", "compile", src.name, "--universal", "--python-version", "3.11", "--generate-hashes",
             "--no-header", "--quiet"],
            check=True, capture_output=True, text=True).stdout
    header = (f"{DIGEST_PREFIX}{requirements_digest(requirements)}\n"
              f"# The runtime stack of the {flavour} image, pinned with hashes: python3 scripts/lock.py rewrites it.\n")
    out.write_text(header + resolved)
    return out


if __name__ == "__main__":
    for flavour in FLAVOURS:
        print(lock(flavour).relative_to(REPO))
