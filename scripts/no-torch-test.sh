#!/usr/bin/env bash
# The tests that need no torch, in an environment without torch (the test-core extra only): proves the
# service, its tests' markers and `pytest -m "not torch"` hold where the export stack is not installed.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-"$REPO/.venv-core"}
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -e "$REPO[test-core]"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "torch is importable in $VENV: this run would prove nothing" >&2
  exit 1
fi
cd "$REPO"
"$VENV/bin/python" -m pytest -q -m "not torch" -p no:cacheprovider
