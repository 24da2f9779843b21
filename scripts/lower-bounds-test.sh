#!/usr/bin/env bash
# The tests that need no torch, once more with every direct dependency at the lowest version pyproject allows
# (uv's lowest-direct resolution): the lower bounds in pyproject are versions the code is tested with.
# torch and transformers are pinned exactly (the test extra), so the torch tests have no lower bound to try.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -m venv .venv-lowest
.venv-lowest/bin/pip install -q uv
.venv-lowest/bin/uv pip install -q --python .venv-lowest/bin/python --resolution lowest-direct -e '.[test-core]'
.venv-lowest/bin/python - <<'PY'
import tomllib
from importlib.metadata import version
from packaging.requirements import Requirement

deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
print("lower bounds under test:", ", ".join(f"{Requirement(d).name}=={version(Requirement(d).name)}" for d in deps))
PY
.venv-lowest/bin/python -m pytest -m "not torch and not converters" -p no:cacheprovider -q -n auto --dist loadfile "$@"
