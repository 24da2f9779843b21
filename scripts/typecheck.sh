#!/usr/bin/env bash
# mypy over the package as it installs: posenc/ with service/ and models/ under it (setup.py maps the
# top-level folders there). mypy finds a module's file by its dotted name, so the check runs in a
# temporary folder that lays the checkout out that way with links to the real files; reports name
# posenc/service/... for service/... . Arguments go to mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
mypy=${MYPY:-$root/.venv/bin/mypy}
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/posenc"
for file in posenc/*.py; do ln -s "$root/$file" "$tree/$file"; done
ln -s "$root/service" "$tree/posenc/service"
ln -s "$root/models" "$tree/posenc/models"
cd "$tree"
"$mypy" --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache" -p posenc "$@"
