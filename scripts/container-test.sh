#!/usr/bin/env bash
# Build the posenc image, run it, check it from the outside, stop it.
#
#   scripts/container-test.sh            # from anywhere; exit status 0 = every check passed
#
# Engine: ../shared/tools/podman (beside the repository) with a locally built python base image
# when present (no registry is reachable there), else $CONTAINER_ENGINE or docker.
# Containers run with --network host on a free port (POSENC_PORT), so no -p publishing is needed.
# Checks: image facts (non-root, no torch, no compiler, exactly one onnxruntime), health and
# HEALTHCHECK, the KServe v2 endpoints, one table in each wire format, /metrics, every shipped model
# READY in the repository index, one inference call on a shipped model (the repository must ship one:
# onnx/*/config.json), the gRPC service on its own port (health, reflection, one inference:
# scripts/container_grpc_check.py, with a $PYTHON that has tritonclient[grpc]), an empty and a broken model repository (up, /v2 present, but unready), a bad
# POSENC_* value (exits, naming the variable); and the pod-shaped runs of scripts/container_pod_check.py.
# Every wait is bounded; containers are removed on exit.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TOOLS="$REPO/../shared/tools"
IMAGE=${POSENC_IMAGE:-localhost/posenc:container-test}
PYTHON=${PYTHON:-python3}
CHECK=("$PYTHON" "$REPO/scripts/container_check.py")
PREFIX="posenc-ct-$$"
WORK=$(mktemp -d)
FAILURES=0
T0=$(date +%s)

log() { printf '[container-test %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }
fail() { log "FAIL: $*"; FAILURES=$((FAILURES + 1)); }

if [ -x "$TOOLS/podman" ] && [ -x "$TOOLS/python-base-image" ]; then
  ENGINE="$TOOLS/podman"
  log "base image: building or reusing the local python base image"
  BASE_IMAGE=$("$TOOLS/python-base-image") || { log "FAIL: $TOOLS/python-base-image"; exit 1; }
  BUILD_ARGS=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
else
  ENGINE=${CONTAINER_ENGINE:-docker}
  BUILD_ARGS=()
  command -v "$ENGINE" >/dev/null || { log "FAIL: no container engine ($ENGINE not found)"; exit 1; }
fi
# ONNXRUNTIME=onnxruntime-gpu scripts/container-test.sh tests the CUDA flavour of the image.
[ -z "${ONNXRUNTIME:-}" ] || BUILD_ARGS+=(--build-arg "ONNXRUNTIME=$ONNXRUNTIME")
IS_PODMAN=$("$ENGINE" --version 2>/dev/null | grep -qi podman && echo 1 || echo 0)
RUN_ARGS=()
if [ "$IS_PODMAN" = 1 ]; then
  # Docker image format: podman's default (OCI) drops HEALTHCHECK. podman schedules health checks
  # with systemd timers (there may be no systemd): the test runs them on demand instead.
  BUILD_ARGS+=(--format docker)
  RUN_ARGS=(--health-interval=disable)
fi

cleanup() {
  local ids
  ids=$("$ENGINE" ps -aq --filter "name=^$PREFIX" 2>/dev/null || true)
  # shellcheck disable=SC2086  # one id per word
  [ -z "$ids" ] || "$ENGINE" rm -f $ids >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run_container NAME PORT [extra run args...]: detached, host network, the image's own CMD.
run_container() {
  local name=$1 port=$2
  shift 2
  timeout 60 "$ENGINE" run -d "${RUN_ARGS[@]}" --name "$PREFIX-$name" --network host -e "POSENC_PORT=$port" "$@" "$IMAGE" \
    >/dev/null 2>"$WORK/run-$name.err" || { cat "$WORK/run-$name.err" >&2; return 1; }
}

running() { [ "$("$ENGINE" inspect --format '{{.State.Running}}' "$PREFIX-$1" 2>/dev/null)" = "true" ]; }
show_logs() { log "logs of $1:"; timeout 20 "$ENGINE" logs "$PREFIX-$1" 2>&1 | tail -n 30 | sed 's/^/    /'; }

# healthy NAME: run the image's HEALTHCHECK now (podman) or wait for docker's verdict (bounded).
healthy() {
  if [ "$IS_PODMAN" = 1 ]; then
    timeout 30 "$ENGINE" healthcheck run "$PREFIX-$1" >/dev/null 2>&1
    return
  fi
  local status deadline=$(($(date +%s) + 90))
  while [ "$(date +%s)" -lt "$deadline" ]; do
    status=$("$ENGINE" inspect --format '{{.State.Health.Status}}' "$PREFIX-$1" 2>/dev/null || echo none)
    case $status in healthy) return 0 ;; unhealthy) return 1 ;; esac
    sleep 2
  done
  return 1
}

step_build() {
  log "build: $ENGINE build $IMAGE"
  local t=$(date +%s)
  timeout 1800 "$ENGINE" build --network host "${BUILD_ARGS[@]}" -t "$IMAGE" "$REPO" >"$WORK/build.log" 2>&1 || {
    tail -n 40 "$WORK/build.log" >&2
    log "FAIL: image build"
    exit 1
  }
  local size
  size=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")
  log "build: done in $(($(date +%s) - t))s; image size $((size / 1000000)) MB ($size bytes)"
}

step_image_facts() {
  local user
  user=$("$ENGINE" image inspect --format '{{.Config.User}}' "$IMAGE")
  [ -n "$user" ] && [ "$user" != root ] && [ "$user" != 0 ] || fail "image runs as root (User=$user)"
  timeout 60 "$ENGINE" run --rm --no-healthcheck --network none "$IMAGE" python3 -c '
import importlib.metadata as md, importlib.util as iu, os, shutil, sys
problems = []
if os.getuid() == 0: problems.append("runs as uid 0")
for mod in ("torch", "transformers", "pytest", "httpx"):
    if iu.find_spec(mod): problems.append(f"{mod} is installed")
names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()}
runtimes = sorted(names & {"onnxruntime", "onnxruntime-gpu"})
if len(runtimes) != 1: problems.append(f"onnxruntime distributions: {runtimes}")
compilers = [c for c in ("gcc", "cc", "g++", "clang", "make") if shutil.which(c)]
if compilers: problems.append(f"compilers present: {compilers}")
print("  image:", "uid", os.getuid(), "runtime", runtimes, "problems", problems)
sys.exit(1 if problems else 0)' || fail "image facts"
}

step_serve() {
  local port grpc_port
  port=$(free_port)
  grpc_port=$(free_port)
  log "serve: shipped model repository on port $port, gRPC on $grpc_port"
  run_container main "$port" -e "POSENC_GRPC_PORT=$grpc_port" || { fail "container did not start"; return; }
  if ! "${CHECK[@]}" wait-ready "http://127.0.0.1:$port" --timeout 90; then
    fail "not ready"; show_logs main; return
  fi
  local model_args=() model
  # The shipped rope_attention model if present, else the first one.
  model=$(find "$REPO/onnx" -mindepth 2 -maxdepth 2 -name config.json 2>/dev/null \
            | awk '/\/rope_attention\/config.json$/ { print "0 " $0; next } { print "1 " $0 }' | sort | head -n 1 | cut -d' ' -f2- || true)
  if [ -z "$model" ]; then
    fail "the repository ships no model (onnx/*/config.json): nothing to check inference with"
    timeout 30 "$ENGINE" stop -t 10 "$PREFIX-main" >/dev/null 2>&1 || true
    return
  fi
  model_args=(--model "$(basename "$(dirname "$model")")" --model-config "$model")
  # every shipped model must be listed by the repository index and READY
  local shipped=()
  mapfile -t shipped < <(find "$REPO/onnx" -mindepth 2 -maxdepth 2 -name config.json -exec dirname {} \; | xargs -n1 basename | sort)
  model_args+=(--expect-models "${shipped[@]}")
  log "serve: inference check with model ${model_args[1]}"
  "${CHECK[@]}" check "http://127.0.0.1:$port" "${model_args[@]}" || { fail "HTTP checks"; show_logs main; }
  if "$PYTHON" -c 'import tritonclient.grpc, grpc_health, grpc_reflection' 2>/dev/null; then
    local causal=()
    "$PYTHON" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("causal") else 1)' "$model" \
      && causal=(--causal)
    "$PYTHON" "$REPO/scripts/container_grpc_check.py" "127.0.0.1:$grpc_port" --model "${model_args[1]}" "${causal[@]}" \
      || { fail "gRPC checks"; show_logs main; }
  elif [ "${CI:-}" = true ]; then
    fail "gRPC checks: $PYTHON has no tritonclient[grpc], grpcio-health-checking, grpcio-reflection"
  else
    log "gRPC checks skipped: $PYTHON has no tritonclient[grpc], grpcio-health-checking, grpcio-reflection"
  fi
  healthy main || fail "HEALTHCHECK does not report healthy"
  timeout 30 "$ENGINE" stop -t 10 "$PREFIX-main" >/dev/null 2>&1 || fail "stop"
}

# step_unready NAME DIR: the service must stay up and answer 503 on /readyz.
step_unready() {
  local name=$1 dir=$2 port
  port=$(free_port)
  chmod -R a+rX "$dir"
  log "unready: $name model repository on port $port"
  run_container "$name" "$port" -v "$dir:/models:ro" -e POSENC_MODEL_REPOSITORY=/models || {
    fail "$name: container did not start"; return; }
  "${CHECK[@]}" expect-unready "http://127.0.0.1:$port" --timeout 60 || fail "$name: not up-but-unready (or no /v2)"
  sleep 2
  running "$name" || { fail "$name: container exited"; show_logs "$name"; return; }
  if healthy "$name"; then fail "$name: HEALTHCHECK says healthy with a $name repository"; fi
  timeout 30 "$ENGINE" stop -t 10 "$PREFIX-$name" >/dev/null 2>&1 || true
}

step_bad_setting() {
  log "bad setting: POSENC_MAX_TABLE_BYTES=lots must stop start-up, naming the variable"
  local rc=0
  timeout 60 "$ENGINE" run --no-healthcheck --name "$PREFIX-badenv" --network host -e POSENC_MAX_TABLE_BYTES=lots "$IMAGE" \
    >"$WORK/badenv.log" 2>&1 || rc=$?
  sed 's/^/    /' "$WORK/badenv.log" | head -n 5
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "bad setting: exit status $rc (expected non-zero, no hang)"
  grep -q POSENC_MAX_TABLE_BYTES "$WORK/badenv.log" || fail "bad setting: message does not name the variable"
}

# The image as deploy/kubernetes runs it: the Deployment's memory limit, read-only root, a fresh /tmp tmpfs,
# uid 10001, the ConfigMap's settings; a first start, the crowd, a restart, a start from the node type's rules.
step_pod() {
  log "pod: the image as the Kubernetes manifest runs it"
  timeout 600 "$PYTHON" "$REPO/scripts/container_pod_check.py" "$ENGINE" "$IMAGE" --crowd-seconds 30 || fail "pod checks"
}

step_build
step_image_facts
step_serve
step_pod
mkdir -p "$WORK/empty" "$WORK/broken/rope_attention" "$WORK/broken/truncated"
step_unready empty "$WORK/empty"
# Broken: a valid config.json (the shipped one, when there is one) over a model.onnx that is not ONNX,
# and a truncated config.json.
printf 'not an onnx model' | tee "$WORK/broken/rope_attention/model.onnx" >"$WORK/broken/truncated/model.onnx"
if [ -f "$REPO/onnx/rope_attention/config.json" ]; then
  cp "$REPO/onnx/rope_attention/config.json" "$WORK/broken/rope_attention/config.json"
else
  printf '{"name": "rope_attention"}' >"$WORK/broken/rope_attention/config.json"
fi
printf '{"name": "truncated", "inputs": [' >"$WORK/broken/truncated/config.json"
step_unready broken "$WORK/broken"
step_bad_setting

if [ "$FAILURES" -ne 0 ]; then
  log "$FAILURES check(s) failed"
  exit 1
fi
log "all container checks passed in $(($(date +%s) - T0))s"
