"""Start or stop a `posenc serve` for a shell script (scripts/live-server.sh):

    python -m posenc.service.testing.serve start --log FILE [--ready /readyz] [--timeout 60] [-- SERVE ARGS...]
    python -m posenc.service.testing.serve stop PID [--timeout 5]

`start` runs `ServerProcess` with the POSENC_* settings of its own environment on a free loopback port, waits
until it is ready, prints `PORT PID` and leaves it running (in its own session); when it does not become
ready it prints the log's tail, stops it and exits 1. `stop` sends SIGTERM, then SIGKILL to the process group
after `--timeout` seconds.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from posenc.service.testing.server import ServerProcess, kill_group


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waiting for its parent's reaping does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def stop_pid(pid: int, timeout: float) -> None:
    """SIGTERM to `pid`; SIGKILL to its process group if it still runs after `timeout` seconds."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        kill_group(pid)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.service.testing.serve",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("start", help="start posenc serve, wait until ready, print PORT PID")
    start.add_argument("--log", required=True, type=Path, help="the server's output goes here")
    start.add_argument("--ready", default="/readyz", help="path that answers 200 once ready (default /readyz)")
    start.add_argument("--timeout", type=float, default=60.0, help="seconds to become ready (default 60)")
    start.add_argument("args", nargs="*", help="more `posenc serve` arguments (after --)")
    stop = commands.add_parser("stop", help="stop a server started here")
    stop.add_argument("pid", type=int)
    stop.add_argument("--timeout", type=float, default=5.0, help="seconds before SIGKILL (default 5)")
    args = parser.parse_args(argv)
    if args.command == "stop":
        stop_pid(args.pid, args.timeout)
        return 0
    server = ServerProcess(args=args.args, ready=args.ready, ready_timeout=args.timeout, log_path=args.log)
    try:
        server.start()
    except RuntimeError as exc:
        sys.stderr.write(f"{str(exc).splitlines()[0]}\n")  # the caller shows the log
        return 1
    print(server.port, server.pid, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
