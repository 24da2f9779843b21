#!/usr/bin/env bash
# The structure and type checks over the package as it installs (scripts/in-installed-layout.sh): the
# import-linter contracts of pyproject.toml (the layers of the rooms, the numeric core without torch or onnx),
# then mypy. Arguments go to mypy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${VENV:-$root/.venv}/bin
"$root/scripts/in-installed-layout.sh" "$bin/lint-imports" --no-cache "$root/pyproject.toml"
"$root/scripts/in-installed-layout.sh" "$bin/mypy" --config-file "$root/pyproject.toml" \
  --cache-dir "$root/.mypy_cache" -p posenc "$@"
