#!/usr/bin/env bash
# Build and test the Go gRPC client (clients/go-grpc) against a live `posenc serve` with its gRPC service on.
#
#   scripts/grpc-client-test.sh                              # uses .venv/bin/python when present
#
# 1. Debian's Go, protoc, protoc-gen-go, protoc-gen-go-grpc and the gRPC and protobuf Go sources are installed
#    with apt-get when missing (root, as in CI; a failed install fails the run);
# 2. the stubs are generated with protoc from the protocol's descriptors as tritonclient ships them
#    (scripts/grpc_descriptors.py): no copy of the .proto files is kept;
# 3. scripts/client_fixtures.py writes the HTTP clients' fixture cases; one server starts on free loopback
#    ports (HTTP and gRPC); 4. `go test` runs offline (GOPATH mode on /usr/share/gocode, GOPROXY=off);
# 5. grpcurl, which knows nothing of the protocol, asks the server through reflection: it lists the services and
#    methods, describes a message and makes unary calls whose schema it downloads (scripts/reflection_cli_check.sh).
NAME=grpc-client-test
source "$(dirname "${BASH_SOURCE[0]}")/live-server.sh"
STEP_TIMEOUT=${STEP_TIMEOUT:-600}

apt_install golang-go protobuf-compiler protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev \
  golang-github-golang-protobuf-1-5-dev \
  golang-google-protobuf-dev
for tool in go protoc protoc-gen-go protoc-gen-go-grpc; do
  command -v "$tool" >/dev/null || { say "FAILED: $tool not found"; exit 1; }
done

SRC="$WORK/gopath/src/posencgrpc"
mkdir -p "$SRC/inference"
cp "$REPO"/clients/go-grpc/*.go "$SRC/"
protos=$("$PYTHON" "$REPO/scripts/grpc_descriptors.py" "$WORK/protocol.pb")
mapping=()
for proto in $protos; do mapping+=("M$proto=posencgrpc/inference"); done
opts=$(IFS=,; echo "paths=source_relative,${mapping[*]}")
protoc --descriptor_set_in="$WORK/protocol.pb" --go_out="$SRC/inference" --go_opt="$opts" \
  --go-grpc_out="$SRC/inference" --go-grpc_opt="$opts" $protos

timeout "$STEP_TIMEOUT" "$PYTHON" "$REPO/scripts/client_fixtures.py" "$WORK/fixtures.json"
POSENC_GRPC_PORT=$("$PYTHON" -c "from posenc.service.testing import free_port; print(free_port())")
export POSENC_GRPC_PORT
start_server
export POSENC_GRPC_ADDRESS="127.0.0.1:$POSENC_GRPC_PORT" POSENC_FIXTURES="$WORK/fixtures.json"

cd "$SRC"
if GOPATH="$WORK/gopath:/usr/share/gocode" GO111MODULE=off GOPROXY=off GOFLAGS= GOCACHE="$WORK/go-cache" \
    timeout "$STEP_TIMEOUT" go test -count=1 -v . 2>&1 | tee "$WORK/go.log"; then
  echo "grpc-client-test: go ok: $(grep -c '^--- PASS' "$WORK/go.log") passed"
else
  say "FAILED; server log tail:"
  server_log_tail
  exit 1
fi
if ! PYTHON="$PYTHON" "$REPO/scripts/reflection_cli_check.sh" "127.0.0.1:$POSENC_GRPC_PORT" "$WORK/grpcurl"; then
  say "FAILED: reflection through grpcurl; server log tail:"
  server_log_tail
  exit 1
fi
