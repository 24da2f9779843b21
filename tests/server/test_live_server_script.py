"""scripts/live-server.sh, which the client, browser, schemathesis and gRPC steps of CI source: the server it starts
is stopped when the script exits, wherever the script stands then, with PYTHON a relative path as CI exports
it (`PYTHON=.venv/bin/python`, relative to the repository; scripts/grpc-client-test.sh then changes into its Go
tree, where that path names nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.onnx_models import ROOT
from tests.processes import running

pytestmark = pytest.mark.server

# Starts a server as the CI scripts do, prints its PID and port, then leaves the repository before exiting.
SCRIPT = """
NAME=live-server-check
source scripts/live-server.sh
start_server
echo "$SERVER_PID $PORT"
cd "$1"
"""


def test_the_exit_trap_stops_the_server_after_the_script_changed_directory(tmp_path: Path) -> None:
    relative = os.path.relpath(sys.executable, ROOT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSENC_")} | {"PYTHON": relative}
    done = subprocess.run(["bash", "-c", SCRIPT, "live-server-check", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 10
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        assert not running(pid), f"the server {pid} outlived its script: {done.stderr}"
    finally:
        if running(pid):
            os.kill(pid, signal.SIGKILL)
