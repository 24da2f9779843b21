#!/usr/bin/env bash
# The service's pages in a headless chromium with the network unreachable, against one live server:
#   /docs and /redoc (scripts/docs_browser_check.py): every operation rendered from assets the service
#     serves itself, no request leaving the host;
#   the explorer at / (scripts/explorer_browser_check.py): loads without console errors, draws the table
#     and properties pictures, redraws when a parameter or the family changes, a screenshot not blank.
#
#   scripts/browser-test.sh                                  # uses .venv/bin/python when present
#   PYTHON=/path/to/venv/bin/python scripts/browser-test.sh
#   SCREENSHOT=/tmp/explorer.png scripts/browser-test.sh     # keep the explorer's final screenshot
#
# Installs Debian's chromium and chromium-driver when missing (apt-get, needs root as in CI; failing to
# install fails the run) and selenium into a throw-away virtual environment (the project's own stays as
# it is). Selenium Manager is told to stay offline: both the browser and the driver paths are given.
NAME=browser-test
source "$(dirname "${BASH_SOURCE[0]}")/live-server.sh"

[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] || apt_install chromium chromium-driver
python3 -m venv "$WORK/venv"
timeout 300 "$WORK/venv/bin/pip" install -q --disable-pip-version-check 'selenium>=4.20'
start_server

URL="http://127.0.0.1:$PORT"
failed=0
SE_OFFLINE=true timeout 180 "$WORK/venv/bin/python" "$REPO/scripts/docs_browser_check.py" "$URL" || {
  say "docs: FAILED (exit $?)"; failed=1; }
SE_OFFLINE=true timeout 300 "$WORK/venv/bin/python" "$REPO/scripts/explorer_browser_check.py" "$URL" \
  ${SCREENSHOT:+--screenshot "$SCREENSHOT"} || { say "explorer: FAILED (exit $?)"; failed=1; }
if [ "$failed" -ne 0 ]; then
  say "server log tail:"
  server_log_tail
fi
exit "$failed"
