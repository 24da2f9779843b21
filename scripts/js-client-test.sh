#!/usr/bin/env bash
# Run the JavaScript client's tests against a live `posenc serve` on a free loopback port.
#
#   scripts/js-client-test.sh                                  # uses .venv/bin/python when present
#   PYTHON=/path/to/venv/bin/python scripts/js-client-test.sh
#
# 1. scripts/client_fixtures.py writes the numbers the Python side computes (needs the test
#    environment: numpy, onnxruntime);  2. the server starts in the background from the same
#    interpreter;  3. `node --test` runs clients/js/test against it;  4. the server is stopped (trap).
NAME=js-client-test
source "$(dirname "${BASH_SOURCE[0]}")/live-server.sh"

command -v node >/dev/null || { echo "js-client-test: node (>= 20) is not installed" >&2; exit 1; }
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' || {
  echo "js-client-test: Node.js >= 20 required, found $(node --version)" >&2; exit 1; }

"$PYTHON" "$REPO/scripts/client_fixtures.py" "$WORK/fixtures.json"

start_server

rc=0
(cd "$REPO/clients/js" && POSENC_URL="http://127.0.0.1:$PORT" POSENC_FIXTURES="$WORK/fixtures.json" \
  timeout 300 node --test --test-reporter=spec) || rc=$?
if [ "$rc" -ne 0 ]; then
  say "FAILED (exit $rc); server log tail:"
  server_log_tail
fi
exit "$rc"
