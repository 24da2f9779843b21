#!/usr/bin/env bash
# Installs and runs the whole test suite, each test once, in the environment it is meant for:
#   .venv-core: the test-core extra (the service and the test tools, no torch): every test outside
#               tests/parity/, which proves that the service and those tests need no torch;
#   .venv:      the test extra (adds torch, transformers, onnx): tests/parity/ (marked `torch` by its folder:
#               parity with the references, the exporter).
# tests/converters/ (marked `converters`: the real third-party converters) runs in neither; its own environment
# is scripts/converter-matrix-test.sh's.
# Both runs spread their tests over every core (pytest-xdist, one module per worker at a time, so a module's
# server starts once). Arguments go to both pytest runs (`scripts/test.sh -x`, `scripts/test.sh -k rope`,
# `scripts/test.sh -n 0` for one process).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1

# uv installs the same pinned requirements as pip, from the same registries, in a fraction of the time (it
# links packages from its cache and downloads in parallel). It reads pip's find-links (where a local torch
# CPU wheel may lie) from pip's configuration, which it does not read itself.
python3 -m venv .venv-core
.venv-core/bin/pip install -q uv
links=()
for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null || true); do
  links+=(--find-links "$dir")
done
install() { .venv-core/bin/uv pip install -q --python "$1" "${links[@]}" -e "$2"; }

install .venv-core/bin/python '.[test-core]'
if .venv-core/bin/python -c "import torch" 2>/dev/null; then
  echo "torch is importable in .venv-core: its run would not prove that the tests need no torch" >&2
  exit 1
fi
python3 -m venv .venv
install .venv/bin/python '.[test]'

# pytest exits 5 when a filter leaves one of the two runs without tests: not a failure here.
run() { "$@" || { status=$?; [ "$status" -eq 5 ] || exit "$status"; }; }
run .venv-core/bin/python -m pytest -m "not torch and not converters" -p no:cacheprovider -n auto --dist loadfile "$@"
run .venv/bin/python -m pytest -m "torch and not converters" -p no:cacheprovider -n auto --dist loadfile "$@"
