#!/usr/bin/env bash
# The explorer page (GET /) in a headless chromium with the network unreachable: it must load without
# console errors, draw the table and properties pictures, redraw when a parameter or the family
# changes, and give a screenshot that is not blank. Same tools and install steps as docs-browser-test.sh.
#
#   scripts/explorer-browser-test.sh                                  # uses .venv/bin/python when present
#   PYTHON=/path/to/venv/bin/python scripts/explorer-browser-test.sh
#   SCREENSHOT=/tmp/explorer.png scripts/explorer-browser-test.sh               # keep the final screenshot
#
# Installs Debian's chromium and chromium-driver when missing (apt-get, needs root as in CI; failing
# to install fails the run), selenium into a throw-away virtual environment (the project's own stays
# as it is), starts `posenc serve` on a free loopback port and runs scripts/explorer_browser_check.py.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ ! -x "$REPO/.venv/bin/python" ] || PYTHON="$REPO/.venv/bin/python"
fi
WORK=$(mktemp -d)
SERVER_PID=""
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "explorer-browser-test: $*" >&2; }

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    say "FAILED: chromium and chromium-driver are missing and apt-get cannot run here (needs root on Debian)"
    exit 1
  fi
  say "installing chromium chromium-driver"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -q >"$WORK/apt.log" 2>&1 &&
    timeout 900 apt-get install -y -q --no-install-recommends chromium chromium-driver >>"$WORK/apt.log" 2>&1 || {
    say "FAILED: apt-get could not install chromium chromium-driver; its log:"
    tail -n 30 "$WORK/apt.log" >&2
    exit 1
  }
fi

# selenium in its own environment: the driver script imports nothing of the project.
python3 -m venv "$WORK/venv"
timeout 300 "$WORK/venv/bin/pip" install -q --disable-pip-version-check 'selenium>=4.20'

PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$REPO" && exec "$PYTHON" -m service.cli serve --host 127.0.0.1 --port "$PORT") >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
if ! "$PYTHON" "$REPO/scripts/container_check.py" wait-ready "http://127.0.0.1:$PORT" --timeout 60; then
  say "server did not become ready; its log:"
  tail -n 40 "$WORK/server.log" >&2
  exit 1
fi

rc=0
# Selenium Manager must not look for drivers or browsers online: both paths are given, and it is told so.
SE_OFFLINE=true timeout 300 "$WORK/venv/bin/python" "$REPO/scripts/explorer_browser_check.py" \
  "http://127.0.0.1:$PORT" ${SCREENSHOT:+--screenshot "$SCREENSHOT"} || rc=$?
if [ "$rc" -ne 0 ]; then
  say "FAILED (exit $rc); server log tail:"
  tail -n 40 "$WORK/server.log" >&2
fi
exit "$rc"
