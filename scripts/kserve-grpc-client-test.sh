#!/usr/bin/env bash
# KServe's own gRPC client (kserve.InferenceGRPCClient) against a live `posenc serve` with gRPC on.
#
#   scripts/kserve-grpc-client-test.sh                       # uses .venv/bin/python for the server
#
# kserve is a test-only dependency with an environment of its own (.venv-kserve, made here when missing,
# kserve pinned): its generated messages clash with tritonclient's in one interpreter. The fixture case is the
# HTTP clients' (scripts/client_fixtures.py): health, the rope_attention output against onnxruntime within 1e-5,
# and an unknown model answered NOT_FOUND with the HTTP error's text.
NAME=kserve-grpc-client-test
source "$(dirname "${BASH_SOURCE[0]}")/live-server.sh"
KSERVE_VERSION=${KSERVE_VERSION:-0.21.0}
KSERVE_VENV="$REPO/.venv-kserve"

if ! "$KSERVE_VENV/bin/python" -c "import kserve" 2>/dev/null; then
  say "making $KSERVE_VENV (kserve==$KSERVE_VERSION)"
  python3 -m venv "$KSERVE_VENV"
  timeout 600 "$KSERVE_VENV/bin/pip" install -q --disable-pip-version-check "kserve==$KSERVE_VERSION"
fi

timeout 300 "$PYTHON" "$REPO/scripts/client_fixtures.py" "$WORK/fixtures.json"
POSENC_GRPC_PORT=$("$PYTHON" -c "from posenc.service.testing import free_port; print(free_port())")
export POSENC_GRPC_PORT
start_server
if POSENC_GRPC_ADDRESS="127.0.0.1:$POSENC_GRPC_PORT" POSENC_FIXTURES="$WORK/fixtures.json" \
    timeout 300 "$KSERVE_VENV/bin/python" "$REPO/scripts/kserve_grpc_client.py"; then
  echo "kserve-grpc-client-test: ok"
else
  say "FAILED; server log tail:"
  server_log_tail
  exit 1
fi
