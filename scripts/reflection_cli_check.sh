#!/usr/bin/env bash
# A command-line gRPC client asks a live server through server reflection only (no .proto, no stubs): what
# `grpcurl list`, `grpcurl list SERVICE` and `grpcurl -d ... METHOD` do. The client is `buf curl` (npm's
# @bufbuild/buf, pinned below), installed into FOLDER.
#
#   scripts/reflection_cli_check.sh HOST:PORT FOLDER
set -euo pipefail
ADDRESS=$1
FOLDER=$2
BUF_VERSION=1.75.0
mkdir -p "$FOLDER"
if [ ! -x "$FOLDER/node_modules/.bin/buf" ]; then
  (cd "$FOLDER" && npm install --silent --no-audit --no-fund "@bufbuild/buf@$BUF_VERSION" >/dev/null)
fi
BUF="$FOLDER/node_modules/.bin/buf"
call() { "$BUF" curl --protocol grpc --http2-prior-knowledge --timeout 30s "$@"; }
fail() { echo "reflection_cli_check: FAILED: $*" >&2; exit 1; }
expect() {  # expect WHAT TEXT PATTERN...
  local what=$1 text=$2; shift 2
  for pattern in "$@"; do
    grep -qE -- "$pattern" <<<"$text" || fail "$what: no line matching '$pattern' in: $text"
  done
}

services=$(call --list-services "http://$ADDRESS")
expect "list services" "$services" '^inference\.GRPCInferenceService$' '^grpc\.health\.v1\.Health$' \
  '^grpc\.reflection\.v1(alpha)?\.ServerReflection$'
methods=$(call --list-methods "http://$ADDRESS")
expect "list methods" "$methods" 'inference\.GRPCInferenceService/ModelInfer$' '/ModelStreamInfer$' '/ModelMetadata$' \
  '/SystemSharedMemoryRegister$' '/RepositoryIndex$'

live=$(call -d '{}' "http://$ADDRESS/inference.GRPCInferenceService/ServerLive")
expect "ServerLive" "$live" '"live": true'
metadata=$(call -d '{"name": "rope_attention"}' "http://$ADDRESS/inference.GRPCInferenceService/ModelMetadata")
expect "ModelMetadata" "$metadata" '"name": "rope_attention"' '"platform": "onnxruntime_onnx"' '"name": "query"'
health=$(call -d '{"service": "rope_attention"}' "http://$ADDRESS/grpc.health.v1.Health/Check")
expect "Health/Check" "$health" '"status": "SERVING"'
# a typed-contents inference, its JSON written by hand from the reflected schema: B=1, S=1, 8 heads of 64, position 0
ones=$(python3 -c 'print(",".join(["1"] * 512))')
tensor() { echo "{\"name\": \"$1\", \"datatype\": \"FP32\", \"shape\": [1, 8, 1, 64], \"contents\": {\"fp32_contents\": [$ones]}}"; }
positions='{"name": "position_ids", "datatype": "INT64", "shape": [1, 1], "contents": {"int64_contents": [0]}}'
request="{\"model_name\": \"rope_attention\", \"inputs\": [$(tensor query), $(tensor key), $(tensor value), $positions]}"
infer=$(call -d "$request" "http://$ADDRESS/inference.GRPCInferenceService/ModelInfer")
# one key: the attention returns its value, 512 float32 ones, as raw little-endian bytes (base64 in JSON)
output=$(python3 -c 'import base64, struct; print(base64.b64encode(struct.pack("<512f", *[1.0] * 512)).decode())')
expect "ModelInfer" "$infer" '"modelName": "rope_attention"' '"name": "output"' "\"$output\""

if unknown=$(call -d '{"name": "no_such_model"}' "http://$ADDRESS/inference.GRPCInferenceService/ModelMetadata" 2>&1); then
  fail "ModelMetadata of an unknown model succeeded: $unknown"
fi
expect "unknown model" "$unknown" 'not_found' "unknown model 'no_such_model'"
echo "reflection_cli_check: buf $BUF_VERSION via reflection: $(wc -l <<<"$services") services, $(wc -l <<<"$methods") methods, 5 calls ok"
