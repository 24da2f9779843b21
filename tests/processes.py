"""Whether a process the tests started (a server) is still running, read from the kernel."""

from __future__ import annotations

from pathlib import Path


def running(pid: int) -> bool:
    """Whether `pid` is a live process; a zombie waiting for its parent (or init) to reap it counts as stopped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in {"Z", "X"}
