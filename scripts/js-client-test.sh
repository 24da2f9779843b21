#!/usr/bin/env bash
# Run the JavaScript client's tests against a live `posenc serve` on a free loopback port.
#
#   scripts/js-client-test.sh                                  # uses .venv/bin/python when present
#   PYTHON=/path/to/venv/bin/python scripts/js-client-test.sh
#
# 1. scripts/js_client_fixtures.py writes the numbers the Python side computes (needs the test
#    environment: numpy, onnxruntime);  2. the server starts in the background from the same
#    interpreter;  3. `node --test` runs clients/js/test against it;  4. the server is stopped (trap).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The interpreter with the project installed: $PYTHON, else the repository's .venv, else python3.
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

command -v node >/dev/null || { echo "js-client-test: node (>= 20) is not installed" >&2; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' || {
  echo "js-client-test: Node.js >= 20 required, found $(node --version)" >&2; exit 1; }

"$PYTHON" "$REPO/scripts/js_client_fixtures.py" "$WORK/fixtures.json"

PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$REPO" && exec "$PYTHON" -m service.cli serve --host 127.0.0.1 --port "$PORT") >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
if ! "$PYTHON" "$REPO/scripts/container_check.py" wait-ready "http://127.0.0.1:$PORT" --timeout 60; then
  echo "js-client-test: server did not become ready; its log:" >&2
  tail -n 40 "$WORK/server.log" >&2
  exit 1
fi

rc=0
(cd "$REPO/clients/js" && POSENC_URL="http://127.0.0.1:$PORT" POSENC_FIXTURES="$WORK/fixtures.json" \
  timeout 300 node --test --test-reporter=spec) || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "js-client-test: FAILED (exit $rc); server log tail:" >&2
  tail -n 40 "$WORK/server.log" >&2
fi
exit "$rc"
