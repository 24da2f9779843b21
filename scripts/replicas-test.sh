#!/usr/bin/env bash
# Three replicas of the posenc image behind nginx on loopback, a mixed load, one replica stopped and started.
#
#   scripts/replicas-test.sh             # exit status 0 = zero failed requests at the client
#
# Builds the image (the layer cache makes a rebuild quick; POSENC_IMAGE=... SKIP_BUILD=1 reuses one), runs
# three containers (--network host, POSENC_PORT each), and nginx with the shipped example configuration
# (deploy/nginx/posenc.conf, ports rewritten to free ones; retries on refused/reset connections, 502 and 503).
# scripts/replicas_load.py drives tables + inference for LOAD_SECONDS (default 40) while replica 2 gets
# SIGTERM (`stop`: it must drain and exit 0), stays down a few seconds and is started again; afterwards the
# restarted replica must have served requests. Checks: zero failed requests, identical answers for identical
# requests, clean exit of the stopped replica, every replica's gRPC service afterwards (the restarted one's too). Every wait is bounded (whole run < 5 min with a cached image);
# containers and nginx are removed on exit. nginx is installed with apt-get when missing (root only).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS="$REPO/../shared/tools"
IMAGE=${POSENC_IMAGE:-localhost/posenc:replicas-test}
if [ -z "${PYTHON:-}" ]; then  # the load (scripts/replicas_load.py) uses the test kit: numpy and the repository
  PYTHON=python3
  [ ! -x "$REPO/.venv/bin/python" ] || PYTHON="$REPO/.venv/bin/python"
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
LOAD_SECONDS=${LOAD_SECONDS:-40}
PREFIX="posenc-rt-$$"
WORK=$(mktemp -d)
chmod 755 "$WORK"  # nginx's workers (user nobody) write request bodies to temporary files under it
NGINX_PID=""
FAILURES=0
T0=$(date +%s)

log() { printf '[replicas-test %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
fail() { log "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

if [ -x "$TOOLS/podman" ] && [ -x "$TOOLS/python-base-image" ]; then
  ENGINE="$TOOLS/podman"
  BUILD_ARGS=(--build-arg "BASE_IMAGE=$("$TOOLS/python-base-image")") || { log "FAIL: python-base-image"; exit 1; }
else
  ENGINE=${CONTAINER_ENGINE:-docker}
  BUILD_ARGS=()
  command -v "$ENGINE" >/dev/null || { log "FAIL: no container engine ($ENGINE not found)"; exit 1; }
fi
if ! command -v nginx >/dev/null && [ -x /usr/sbin/nginx ]; then PATH="$PATH:/usr/sbin"; fi
if ! command -v nginx >/dev/null; then
  [ "$(id -u)" = 0 ] || { log "FAIL: nginx is not installed (apt-get install nginx)"; exit 1; }
  log "installing nginx (apt-get)"
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y --no-install-recommends nginx >"$WORK/apt.log" 2>&1 \
    || { tail -n 20 "$WORK/apt.log" >&2; log "FAIL: apt-get install nginx"; exit 1; }
  PATH="$PATH:/usr/sbin"
fi

cleanup() {
  local ids
  [ -z "$NGINX_PID" ] || kill "$NGINX_PID" 2>/dev/null || true
  ids=$("$ENGINE" ps -aq --filter "name=^$PREFIX" 2>/dev/null || true)
  # shellcheck disable=SC2086  # one id per word
  [ -z "$ids" ] || timeout 60 "$ENGINE" rm -f $ids >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$PYTHON" -c 'from posenc.service.testing import free_port; print(free_port())'
}

# wait_ready URL SECONDS: until GET URL/readyz answers 200.
wait_ready() {
  "$PYTHON" "$REPO/scripts/container_check.py" wait-ready "$1" --timeout "$2"
}

if [ "${SKIP_BUILD:-0}" = 1 ]; then
  log "build: reusing $IMAGE"
else
  log "build: $ENGINE build $IMAGE"
  timeout 1800 "$ENGINE" build --network host "${BUILD_ARGS[@]}" -t "$IMAGE" "$REPO" >"$WORK/build.log" 2>&1 || {
    tail -n 40 "$WORK/build.log" >&2; log "FAIL: image build"; exit 1; }
fi

PORTS=("$(free_port)" "$(free_port)" "$(free_port)")
GRPC_PORTS=("$(free_port)" "$(free_port)" "$(free_port)")  # one host network: each replica its own gRPC port
LB_PORT=$(free_port)
for i in 0 1 2; do
  # One intra-op thread each: three replicas, the load and nginx share this machine's cores. The CPU-graph rule
  # is config.json's: three start-up calibrations at once on two cores, and another one by the restarted replica
  # while the load runs, would measure the load (and outlast the restart's window).
  timeout 60 "$ENGINE" run -d --name "$PREFIX-$((i + 1))" --network host --no-healthcheck \
    -e "POSENC_PORT=${PORTS[$i]}" -e "POSENC_GRPC_PORT=${GRPC_PORTS[$i]}" -e POSENC_ACCESS_LOG=false \
    -e POSENC_INTRA_OP_NUM_THREADS=1 -e POSENC_CPU_FORM_FROM=config \
    -e POSENC_GRACEFUL_SHUTDOWN_TIMEOUT=10 "$IMAGE" >/dev/null
done
for i in 0 1 2; do
  wait_ready "http://127.0.0.1:${PORTS[$i]}" 90 || { fail "replica $((i + 1)) not ready"; exit 1; }
done
log "replicas ready on ports ${PORTS[*]}"

# The shipped example, with this run's ports; logs and temporary files in $WORK.
sed -e "s/127\.0\.0\.1:18001/127.0.0.1:${PORTS[0]}/; s/127\.0\.0\.1:18002/127.0.0.1:${PORTS[1]}/" \
    -e "s/127\.0\.0\.1:18003/127.0.0.1:${PORTS[2]}/; s/listen 127\.0\.0\.1:18000/listen 127.0.0.1:$LB_PORT/" \
    "$REPO/deploy/nginx/posenc.conf" >"$WORK/posenc.conf"
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 256; }
http {
    access_log off;
    client_body_temp_path $WORK/body;
    proxy_temp_path $WORK/proxy;
    fastcgi_temp_path $WORK/fastcgi;
    uwsgi_temp_path $WORK/uwsgi;
    scgi_temp_path $WORK/scgi;
    include $WORK/posenc.conf;
}
EOF
nginx -t -c "$WORK/nginx.conf" -p "$WORK" >"$WORK/nginx-t.log" 2>&1 || { cat "$WORK/nginx-t.log" >&2; exit 1; }
nginx -c "$WORK/nginx.conf" -p "$WORK" -g "daemon off;" &
NGINX_PID=$!
wait_ready "http://127.0.0.1:$LB_PORT" 20 || { fail "nginx does not pass requests on"; exit 1; }
log "nginx on port $LB_PORT; load for ${LOAD_SECONDS}s"

timeout $((LOAD_SECONDS + 150)) "$PYTHON" "$REPO/scripts/replicas_load.py" "http://127.0.0.1:$LB_PORT" \
  --seconds "$LOAD_SECONDS" --clients 6 >"$WORK/load.log" 2>&1 &
LOAD_PID=$!

sleep $((LOAD_SECONDS / 4))
log "stopping replica 2 (SIGTERM)"
timeout 60 "$ENGINE" stop -t 20 "$PREFIX-2" >/dev/null || fail "podman stop replica 2"
status=$("$ENGINE" inspect --format '{{.State.ExitCode}}' "$PREFIX-2")
[ "$status" = 0 ] || { fail "replica 2 exited with status $status after SIGTERM (expected 0)"; \
  timeout 20 "$ENGINE" logs "$PREFIX-2" 2>&1 | tail -n 20 >&2; }
sleep 3
log "starting replica 2 again"
timeout 60 "$ENGINE" start "$PREFIX-2" >/dev/null || fail "podman start replica 2"
wait_ready "http://127.0.0.1:${PORTS[1]}" 90 || fail "replica 2 not ready after the restart"
log "replica 2 ready again"

load_status=0
wait "$LOAD_PID" || load_status=$?
cat "$WORK/load.log"
[ "$load_status" = 0 ] || fail "the load saw failed requests, differing answers or a hang (status $load_status)"

# The restarted replica's metrics start at zero: anything counted there was served after the restart.
served=$("$PYTHON" - "http://127.0.0.1:${PORTS[1]}/metrics" <<'EOF'
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
print(int(sum(float(v) for v in re.findall(r'^posenc_http_requests_total\{[^}]*route="/v[12][^"]*"[^}]*\} (\S+)$',
                                             text, re.M))))
EOF
)
log "replica 2 served $served requests after its restart"
[ "$served" -gt 0 ] || fail "the restarted replica got no traffic"
# Every replica's gRPC service, the restarted one's too: health, reflection, one inference (its own port each).
for i in 0 1 2; do
  "$PYTHON" "$REPO/scripts/container_grpc_check.py" "127.0.0.1:${GRPC_PORTS[$i]}" --model rope_attention --causal \
    || fail "gRPC checks of replica $((i + 1))"
done
if grep -q '\[error\]' "$WORK/nginx-error.log"; then
  log "nginx retried on another replica $(grep -c '\[error\]' "$WORK/nginx-error.log") time(s), e.g.:"
  grep '\[error\]' "$WORK/nginx-error.log" | head -n 3 | sed 's/^/    /'
fi

if [ "$FAILURES" -ne 0 ]; then
  log "$FAILURES check(s) failed"
  exit 1
fi
log "zero failed requests; all replica checks passed in $(($(date +%s) - T0))s"
