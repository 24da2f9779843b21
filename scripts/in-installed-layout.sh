#!/usr/bin/env bash
# Runs a command (its arguments) in a temporary folder that lays this checkout out as it installs: posenc/ with
# service/ and models/ under it (setup.py maps the top-level folders there), as links to the real files, first
# on PYTHONPATH. For tools that find a module's file by its dotted name (mypy, import-linter): they see every
# import between the rooms. POSENC_CHECKOUT names the checkout for the command.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir "$tree/posenc"
for file in "$root"/posenc/*.py; do ln -s "$file" "$tree/posenc/$(basename "$file")"; done
ln -s "$root/service" "$tree/posenc/service"
ln -s "$root/models" "$tree/posenc/models"
cd "$tree"
PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" POSENC_CHECKOUT=$root "$@"
