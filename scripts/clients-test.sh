#!/usr/bin/env bash
# Build and test the C++, Go, Java and Rust clients (clients/*) against one live `posenc serve`.
#
#   scripts/clients-test.sh                                  # uses .venv/bin/python when present
#   PYTHON=/path/to/venv/bin/python scripts/clients-test.sh
#
# 1. the toolchains are installed with apt-get when missing (Debian; needs root, as in CI): a
#    toolchain that cannot be installed fails the run, no client is skipped;
# 2. scripts/client_fixtures.py writes the numbers the Python side computes (tables, and
#    onnxruntime's output for the shipped model);  3. one server starts on a free loopback port;
# 4. each client builds into a temporary directory and runs its tests, each step under `timeout`;
# 5. one summary line per client; the exit status is non-zero when any client failed.
# Nothing is downloaded at build time: Debian's cmake/g++/libcurl/nlohmann-json, golang-go (standard
# library only, GOPROXY=off), the default JDK with Debian's Gson jar (javac/java, no Maven) and Debian's
# cargo/rustc with the crates Debian packages (serde_json, ureq: /usr/share/cargo/registry, --offline).
# docs/clients.md gives each client's libraries and why.
NAME=clients-test
source "$(dirname "${BASH_SOURCE[0]}")/live-server.sh"
# Per client: the Rust step compiles its crates from source first (about 2.5 min on a busy 2-core machine).
STEP_TIMEOUT=${STEP_TIMEOUT:-600}

# Debian packages of every toolchain and library: C++ (cmake, g++, libcurl, nlohmann/json), Go, Java (Gson),
# Rust (the crates of clients/rust/Cargo.toml as librust-*-dev sources).
PACKAGES=(cmake make g++ pkg-config libcurl4-openssl-dev nlohmann-json3-dev golang-go default-jdk-headless
          libgoogle-gson-java cargo rustc librust-serde-json-dev librust-ureq-dev librust-url-dev librust-base64-dev)
GSON_JAR=/usr/share/java/gson.jar
DEBIAN_CRATES=/usr/share/cargo/registry
install_toolchains() {
  if command -v dpkg-query >/dev/null; then
    apt_install "${PACKAGES[@]}"
  else
    say "not a Debian system: the toolchains must already be installed"
  fi
  # Debian's toolchains, not whatever else is first on PATH (e.g. a rustup install in ~/.cargo).
  for tool in cmake g++ go javac java cargo rustc; do
    [ -x "/usr/bin/$tool" ] || command -v "$tool" >/dev/null || { say "FAILED: $tool not found"; exit 1; }
  done
  [ -r "$GSON_JAR" ] || { say "FAILED: $GSON_JAR not found (Debian's libgoogle-gson-java)"; exit 1; }
  [ -d "$DEBIAN_CRATES" ] || { say "FAILED: $DEBIAN_CRATES not found (Debian's librust-*-dev packages)"; exit 1; }
}

# Each client's build and test, run from the repository root with POSENC_URL/POSENC_FIXTURES set.
client_cpp() {
  cmake -S clients/cpp -B "$WORK/cpp" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
    cmake --build "$WORK/cpp" -j 2 &&
    ctest --test-dir "$WORK/cpp" --output-on-failure -V
}
client_go() {
  (cd clients/go && GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GO111MODULE=on GOCACHE="$GOCACHE" \
    /usr/bin/go test -count=1 -v ./...)
}
client_java() {
  javac -Xlint:all -Werror -cp "$GSON_JAR" -d "$WORK/java" $(find clients/java/src clients/java/test -name '*.java') &&
    java -cp "$WORK/java:$GSON_JAR" posenc.PosencClientTest
}
# crates.io is replaced by Debian's registry in a CARGO_HOME of this run only (a developer's own cargo
# setup is left alone); --locked: clients/rust/Cargo.lock is what resolves from it.
client_rust() {
  mkdir -p "$WORK/cargo-home" &&
    printf '[source.crates-io]\nreplace-with = "debian"\n[source.debian]\ndirectory = "%s"\n' "$DEBIAN_CRATES" \
      >"$WORK/cargo-home/config.toml" &&
    (cd clients/rust && PATH="/usr/bin:$PATH" CARGO_HOME="$WORK/cargo-home" CARGO_TARGET_DIR="$WORK/rust" \
      /usr/bin/cargo test --offline --locked)
}

# "N passed, M failed" from a client's log, whatever its test runner printed.
counts() {
  local log=$1 passed failed
  passed=$(grep -cE '^--- PASS|^test .* \.\.\. ok$' "$log" || true)
  failed=$(grep -cE '^--- FAIL|^test .* \.\.\. FAILED$' "$log" || true)
  if grep -qE '[0-9]+ passed, [0-9]+ failed' "$log"; then
    grep -oE '[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1
  else
    echo "$passed passed, $failed failed"
  fi
}

install_toolchains
export GOCACHE=${GOCACHE:-"$WORK/go-cache"}

timeout "$STEP_TIMEOUT" "$PYTHON" "$REPO/scripts/client_fixtures.py" "$WORK/fixtures.json"

start_server
export POSENC_URL="http://127.0.0.1:$PORT" POSENC_FIXTURES="$WORK/fixtures.json"

cd "$REPO"
summary=()
failed=0
for client in cpp go java rust; do
  echo "=== $client client ==="
  start=$(date +%s)
  rc=0
  # `timeout` needs a program: the client function runs in a child bash that sees these definitions.
  timeout "$STEP_TIMEOUT" bash -c "$(declare -f "client_$client"); set -o pipefail; WORK='$WORK'
    GSON_JAR='$GSON_JAR' DEBIAN_CRATES='$DEBIAN_CRATES'; client_$client" \
    2>&1 | tee "$WORK/$client.log" || rc=$?
  seconds=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    summary+=("clients-test: $client ok: $(counts "$WORK/$client.log") (${seconds}s)")
  else
    failed=$((failed + 1))
    summary+=("clients-test: $client FAILED (exit $rc): $(counts "$WORK/$client.log") (${seconds}s)")
  fi
done
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
  say "$failed client(s) failed; server log tail:"
  server_log_tail
  exit 1
fi
