# Sourced by the scripts that test something against a live `posenc serve` (clients, browsers):
#
#   NAME=my-test; source "$(dirname "${BASH_SOURCE[0]}")/live-server.sh"
#   apt_install chromium chromium-driver      # Debian packages, when missing (root; failure exits 1)
#   start_server                              # sets PORT and SERVER_PID; exits 1 with the log if not ready
#
# The server is the test kit's (`python -m posenc.service.testing.serve start|stop`): POSENC_* settings from the
# environment, a free loopback port, ready when /readyz answers, stopped by PID (SIGTERM, then SIGKILL).
# Sets REPO, PYTHON ($PYTHON, absolute, else the repository's .venv, else python3), WORK (a temporary folder) and
# a trap that stops the server and removes WORK on exit; `say` prefixes messages with $NAME.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ ! -x "$REPO/.venv/bin/python" ] || PYTHON="$REPO/.venv/bin/python"
fi
# A relative path (CI exports PYTHON=.venv/bin/python) made absolute: the scripts change directory, and the
# exit trap stops the server with this interpreter wherever the script stands then.
[[ "$PYTHON" != */* || "$PYTHON" == /* ]] || PYTHON="$PWD/$PYTHON"
WORK=$(mktemp -d)
SERVER_PID=""
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

say() { echo "$NAME: $*" >&2; }

cleanup() {
  [ -z "$SERVER_PID" ] || "$PYTHON" -m posenc.service.testing.serve stop "$SERVER_PID" --timeout 5 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Install the Debian packages among "$@" that are not installed yet; no apt-get (not root, not Debian)
# or a failed install fails the run: nothing is skipped.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ "${#missing[@]}" -gt 0 ] || return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    say "FAILED: ${missing[*]} missing and apt-get cannot run here (needs root on Debian)"
    exit 1
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  timeout 600 apt-get update -q >"$WORK/apt.log" 2>&1 &&
    timeout 900 apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$WORK/apt.log" 2>&1 || {
    say "FAILED: apt-get could not install ${missing[*]}; its log:"
    tail -n 30 "$WORK/apt.log" >&2
    exit 1
  }
}

# `posenc serve [ARGS]` on a free loopback port, its output in $WORK/server.log; waits until /readyz answers.
start_server() {
  local started
  if ! started=$(cd "$REPO" && "$PYTHON" -m posenc.service.testing.serve start --log "$WORK/server.log" --timeout 60 \
      -- "$@"); then
    say "server did not become ready; its log:"
    tail -n 40 "$WORK/server.log" >&2
    exit 1
  fi
  read -r PORT SERVER_PID <<<"$started"
}

# The server log's tail after a failure.
server_log_tail() {
  tail -n 40 "$WORK/server.log" >&2
}
