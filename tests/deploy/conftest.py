"""The deployment files and the wheel: container build files, Kubernetes and KServe manifests, packaging."""

import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.onnx_models import ROOT

WHEEL_SOURCES = ("pyproject.toml", "setup.py", "README.md", "posenc", "service", "models", "onnx")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """posenc's wheel, built once per session."""
    # built from a copy of what the wheel is made of: a build/ folder left in the checkout would add its files
    source, dist = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(dist), str(source)], check=True, capture_output=True, timeout=300)
    (built,) = dist.glob("posenc-*.whl")
    return built


def venv_with_wheel(wheel: Path, env: Path) -> tuple[Path, str]:
    """A fresh venv at `env` that gets posenc only from the wheel and sees this environment's dependencies (a
    .pth file: not its site directory, so the editable install of the checkout is not active there); its
    python and its site directory."""
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    zipfile.ZipFile(wheel).extractall(site)
    return python, site
