#!/usr/bin/env bash
# Fuzz a live `posenc serve` from its own OpenAPI document with schemathesis: all checks, the coverage,
# fuzzing and stateful phases, bounded in time. Fails on any 5xx or conformance failure.
#
#   scripts/schemathesis-test.sh            # uses .venv/bin/python when present, else $PYTHON / python3
NAME=schemathesis-test
source "$(dirname "${BASH_SOURCE[0]}")/live-server.sh"

ST="$(dirname "$PYTHON")/st"
[ -x "$ST" ] || { say "schemathesis is not installed next to $PYTHON (pip install -e '.[test-core]')"; exit 1; }
export POSENC_ACCESS_LOG=false POSENC_LOG_LEVEL=warning
# smaller size limits than the defaults (256 MiB, 2^22 cells): the coverage phase's largest boundaries answer 413
# instead of computing and sending the largest tables (scripts/schemathesis.toml, "Time")
export POSENC_MAX_TABLE_BYTES=$((16 << 20)) POSENC_MAX_PNG_PIXELS=$((1 << 20))
start_server

status=0
timeout 300 "$ST" --config-file "$REPO/scripts/schemathesis.toml" run "http://127.0.0.1:$PORT/openapi.json" \
  --checks all --phases examples,coverage,fuzzing,stateful || status=$?
if grep -q "Traceback" "$WORK/server.log"; then
  say "the server logged a traceback:"; cat "$WORK/server.log" >&2; status=1
fi
[ "$status" -eq 124 ] && say "schemathesis did not finish in 300 s"
exit "$status"
