"""The pre-commit hook (.pre-commit-hooks.yaml): a repository of model files audits them on commit against the
reference its .pre-commit-config.yaml declares.

The end-to-end test is what a model repository does: its config names this repository (a committed copy of what
pip installs from it, and the manifest) at a commit, with `args: [--config, config.json]`; `pre-commit install`,
then `git commit`. pre-commit clones the hook repository, pip-installs posenc with the hook's
additional_dependencies into a virtualenv of its own (from the package index, as for any user), and runs
`posenc audit` on the staged model files: a correct ONNX export and its config.json commit, a GGUF written with the
wrong rope base does not, the mistake named in the output."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from posenc.service.cli.main import main
from tests.audit_files import SMALL_LLAMA3, caches_of, genai_onnx, llama_gguf_meta, write_gguf

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / ".pre-commit-hooks.yaml"
# what `pip install .` of the hook repository builds from (tests/deploy/conftest.py's WHEEL_SOURCES), and the manifest
HOOK_REPO_SOURCES = ("pyproject.toml", "setup.py", "README.md", "posenc", "service", "models", "onnx",
                     ".pre-commit-hooks.yaml")


def hook() -> dict[str, Any]:
    (only,) = yaml.safe_load(MANIFEST.read_text())
    assert only["id"] == "posenc-audit"
    return only


def test_the_manifest_is_valid_for_pre_commit() -> None:
    pytest.importorskip("pre_commit", reason="the pre-commit package (test-core extra)")
    result = subprocess.run([sys.executable, "-m", "pre_commit", "validate-manifest", str(MANIFEST)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_hook_picks_the_model_files() -> None:
    files = re.compile(hook()["files"])
    picked = ["config.json", "models/llama/config.json", "model.gguf", "Llama-3.1-8B-Q4_K_M.gguf", "onnx/model.onnx",
              "model.safetensors", "model-00001-of-00004.safetensors"]
    left = ["generation_config.json", "tokenizer_config.json", "model.safetensors.index.json", "model.onnx.data",
            "model.onnx_data", "config.json.bak", "README.md", "tokenizer.json"]
    assert [name for name in picked if not files.search(name)] == []
    assert [name for name in left if files.search(name)] == []


def test_the_hook_installs_the_audit_extra() -> None:
    # pre-commit installs the hook repository with `pip install .` plus additional_dependencies: the GGUF and ONNX
    # readers need what the audit extra names, no more and no less
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert hook()["additional_dependencies"] == extras["audit"]
    assert hook()["entry"] == "posenc audit" and hook()["language"] == "python"


def test_several_files_each_reported_and_the_worst_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # what the hook runs: `posenc audit ARGS FILE...`
    good, wrong = _model_files(tmp_path)
    assert main(["audit", "--config", str(good["config.json"]), *map(str, good.values())]) == 0
    out = capsys.readouterr().out
    assert out.count("position handling: CORRECT") == 2 and f"{good['model.onnx']}: onnx" in out
    names = [*map(str, good.values()), str(wrong)]
    assert main(["audit", "--config", str(good["config.json"]), *names]) == 1
    out = capsys.readouterr().out
    assert f"{wrong}: gguf — position handling: WRONG" in out and "wrong_freq_base" in out
    assert main(["audit", "--config", str(good["config.json"]), "--json", *names]) == 1
    docs = json.loads(capsys.readouterr().out)
    assert list(docs) == names and [doc["verdict"] for doc in docs.values()] == ["correct", "correct", "wrong"]
    assert main(["audit", "--config", str(good["config.json"]), str(tmp_path / "missing.gguf"), *names]) == 2
    assert "missing.gguf" in capsys.readouterr().err
    assert main(["audit", "--png", str(tmp_path / "a.png"), *names]) == 2
    assert "--png takes one FILE" in capsys.readouterr().err


def _model_files(folder: Path) -> tuple[dict[str, Path], Path]:
    """A small Llama-3.1-style model's config.json and ONNX export (correct), and a GGUF of it written with the
    default rope base (the converter did not read rope_theta)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA3, indent=1))
    onnx = folder / "model.onnx"
    onnx.write_bytes(genai_onnx(*caches_of(SMALL_LLAMA3, 2048)))
    gguf = write_gguf(folder / "model.gguf", "llama", llama_gguf_meta(2048, 10000.0, hidden=512, heads=8, kv=2, rot=64))
    return {"config.json": config, "model.onnx": onnx}, gguf


def _git(cwd: Path, *args: str, env: dict[str, str]) -> str:
    result = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


@pytest.mark.timeout(1200)
def test_a_model_repository_audits_its_files_on_commit(tmp_path: Path) -> None:
    pytest.importorskip("pre_commit", reason="the pre-commit package (test-core extra)")
    if shutil.which("git") is None:
        pytest.skip("needs git")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PRE_COMMIT", "SKIP"))},
           "PRE_COMMIT_HOME": str(tmp_path / "pre-commit-home"), "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.invalid",
           "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.invalid"}

    # the hook repository: this checkout's installable tree and manifest, committed (pre-commit clones a commit)
    hooks = tmp_path / "posenc"
    hooks.mkdir()
    for name in HOOK_REPO_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, hooks / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, hooks / name)
    _git(hooks, "init", "-q", env=env)
    _git(hooks, "add", "-A", env=env)
    _git(hooks, "commit", "-q", "-m", "posenc", env=env)
    rev = _git(hooks, "rev-parse", "HEAD", env=env)

    # the model repository, declaring its reference: its config.json
    models = tmp_path / "model-repo"
    good, wrong = _model_files(models)
    (models / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [
        {"repo": str(hooks), "rev": rev, "hooks": [{"id": "posenc-audit", "args": ["--config", "config.json"]}]}]}))
    _git(models, "init", "-q", env=env)
    install = subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=models, env=env,
                             capture_output=True, text=True, timeout=120)
    assert install.returncode == 0, install.stdout + install.stderr

    def commit(*names: str) -> subprocess.CompletedProcess[str]:
        _git(models, "add", *names, env=env)
        return subprocess.run(["git", "commit", "-m", " ".join(names)], cwd=models, env=env, capture_output=True,
                              text=True, timeout=900)  # the first builds the hook's virtualenv

    passed = commit(".pre-commit-config.yaml", *good)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert re.search(r"posenc audit \(position handling\)\.+Passed", passed.stdout + passed.stderr), passed.stdout
    head = _git(models, "rev-parse", "HEAD", env=env)

    failed = commit(wrong.name)
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0, output
    assert re.search(r"posenc audit \(position handling\)\.+Failed", output), output
    assert "model.gguf: gguf — position handling: WRONG" in output and "wrong_freq_base" in output, output
    assert _git(models, "rev-parse", "HEAD", env=env) == head  # the wrong file was not committed
