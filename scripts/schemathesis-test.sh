#!/usr/bin/env bash
# Fuzz a live `posenc serve` from its own OpenAPI document with schemathesis: all checks, the coverage,
# fuzzing and stateful phases, bounded in time. Fails on any 5xx or conformance failure.
#
#   scripts/schemathesis-test.sh            # uses .venv/bin/python when present, else $PYTHON / python3
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ ! -x "$REPO/.venv/bin/python" ] || PYTHON="$REPO/.venv/bin/python"
fi
ST="$(dirname "$PYTHON")/st"
[ -x "$ST" ] || { echo "schemathesis is not installed next to $PYTHON (pip install -e '.[test-core]')" >&2; exit 1; }
PORT=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp)
SERVER_PID=""
cleanup() {
  [ -z "$SERVER_PID" ] || kill "$SERVER_PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -f "$LOG"
}
trap cleanup EXIT

cd "$REPO"
POSENC_PORT=$PORT POSENC_ACCESS_LOG=false POSENC_LOG_LEVEL=warning "$PYTHON" -m service.cli serve >"$LOG" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  "$PYTHON" -c "import urllib.request as r; r.urlopen('http://127.0.0.1:$PORT/readyz', timeout=1)" 2>/dev/null && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$LOG"; echo "server did not start" >&2; exit 1; }
  sleep 0.2
done

status=0
timeout 300 "$ST" --config-file "$REPO/scripts/schemathesis.toml" run "http://127.0.0.1:$PORT/openapi.json" \
  --checks all --phases examples,coverage,fuzzing,stateful || status=$?
if grep -q "Traceback" "$LOG"; then
  echo "the server logged a traceback:" >&2; cat "$LOG" >&2; status=1
fi
[ "$status" -eq 124 ] && echo "schemathesis did not finish in 300 s" >&2
exit "$status"
