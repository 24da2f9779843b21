"""Static checks of the container build files (the container itself: scripts/container-test.sh)."""

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("runtime", ["onnxruntime", "onnxruntime-gpu", "onnxruntime-gpu[cuda,cudnn]"])
def test_exactly_one_onnxruntime_with_pyproject_bounds(runtime: str) -> None:
    requirements = load_script("runtime_requirements").runtime_requirements(str(REPO / "pyproject.toml"), runtime)
    onnx = [r for r in requirements if r.lower().startswith("onnxruntime")]
    assert len(onnx) == 1 and onnx[0].startswith(runtime)
    assert re.search(r"[<>=]", onnx[0])  # pyproject's version bounds kept
    assert not any(r.split("[")[0].split(">")[0].strip() in ("torch", "transformers", "pytest") for r in requirements)


@pytest.mark.parametrize("runtime", ["onnx", "onnxruntime-gpu; rm -rf /", "torch"])
def test_other_runtimes_are_refused(runtime: str) -> None:
    with pytest.raises(SystemExit, match="ONNXRUNTIME"):
        load_script("runtime_requirements").runtime_requirements(str(REPO / "pyproject.toml"), runtime)


def test_dockerfile_essentials() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.\d+-slim$", text, re.M)
    assert re.search(r"^ARG ONNXRUNTIME=onnxruntime$", text, re.M)
    assert re.search(r"^USER (?!root|0\b)\w+", text, re.M)
    assert re.search(r"^EXPOSE 8000 8001$", text, re.M)
    assert "HEALTHCHECK" in text and "/readyz" in text and "urllib" in text
    assert re.search(r'^CMD \["posenc", "serve"\]$', text, re.M)
    assert "POSENC_MODEL_REPOSITORY=" in text and "POSENC_HOST=0.0.0.0" in text and "POSENC_PORT=8000" in text
    assert not re.search(r"install[^\n]*(torch|\[test\]|\[export\])", text)


def test_dockerignore_keeps_tests_caches_and_git_out() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".git", "tests", "**/__pycache__", ".pytest_cache", ".mypy_cache", ".venv"} <= ignored
    assert not {"onnx", "service", "models", "pyproject.toml", "README.md"} & ignored
