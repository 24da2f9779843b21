#!/usr/bin/env bash
# Installs and runs the whole test suite, each test once, in the environment it is meant for:
#   .venv-core: the test-core extra (the service and the test tools, no torch): every test not marked
#               `torch`, which proves that the service and those tests need no torch;
#   .venv:      the test extra (adds torch, transformers, onnx): the tests marked `torch` (parity with the
#               references, the exporter).
# Arguments go to both pytest runs (`scripts/test.sh -x`, `scripts/test.sh -k rope`).
set -euo pipefail
cd "$(dirname "$0")/.."
# No byte-compiling at install (a third of the install time with torch): modules compile when imported.
export PIP_DISABLE_PIP_VERSION_CHECK=1

python3 -m venv .venv-core && .venv-core/bin/pip install -q --no-compile -e '.[test-core]'
if .venv-core/bin/python -c "import torch" 2>/dev/null; then
  echo "torch is importable in .venv-core: its run would not prove that the tests need no torch" >&2
  exit 1
fi
python3 -m venv .venv && .venv/bin/pip install -q --no-compile -e '.[test]'

# pytest exits 5 when a filter leaves one of the two runs without tests: not a failure here.
run() { "$@" || { status=$?; [ "$status" -eq 5 ] || exit "$status"; }; }
run .venv-core/bin/python -m pytest -m "not torch" -p no:cacheprovider "$@"
run .venv/bin/python -m pytest -m torch "$@"
