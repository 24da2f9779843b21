#!/usr/bin/env bash
# KServe's own gRPC client (kserve.InferenceGRPCClient) against a live `posenc serve` with gRPC on.
#
#   scripts/kserve-grpc-client-test.sh                       # uses .venv/bin/python for the server
#
# kserve is a test-only dependency with an environment of its own (.venv-bench-kserve, the benchmark's KServe
# peer's, made here when missing): its generated messages clash with tritonclient's in one interpreter. The fixture case is the
# HTTP clients' (scripts/client_fixtures.py): health, the rope_attention output against onnxruntime within 1e-5,
# and an unknown model answered NOT_FOUND with the HTTP error's text.
NAME=kserve-grpc-client-test
source "$(dirname "${BASH_SOURCE[0]}")/live-server.sh"
# the benchmark's KServe environment, made when missing (bench.peers.kserve_python: one way to make it)
KSERVE_PYTHON=$(cd "$REPO" && timeout 900 "$PYTHON" -c '
import sys
from bench.peers import kserve_python
python, why = kserve_python(create=True)
print(python or "")
sys.exit(0 if python else why)') || { say "FAILED: no KServe environment"; exit 1; }

timeout 300 "$PYTHON" "$REPO/scripts/client_fixtures.py" "$WORK/fixtures.json"
POSENC_GRPC_PORT=$("$PYTHON" -c "from posenc.service.testing import free_port; print(free_port())")
export POSENC_GRPC_PORT
start_server
if POSENC_GRPC_ADDRESS="127.0.0.1:$POSENC_GRPC_PORT" POSENC_FIXTURES="$WORK/fixtures.json" \
    timeout 300 "$KSERVE_PYTHON" "$REPO/scripts/kserve_grpc_client.py"; then
  echo "kserve-grpc-client-test: ok"
else
  say "FAILED; server log tail:"
  server_log_tail
  exit 1
fi
