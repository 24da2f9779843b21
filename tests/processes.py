"""Processes the tests start: whether one (a server) is still running, read from the kernel; a probe run as
another user."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def running(pid: int) -> bool:
    """Whether `pid` is a live process; a zombie waiting for its parent (or init) to reap it counts as stopped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in {"Z", "X"}


def as_user(uid: int, probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`probe()` (a JSON document) run in a forked child that dropped to uid and gid `uid`, no supplementary
    groups; the test is skipped when the child cannot drop."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 1
        try:
            os.close(read_end)
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                result = {"uid": os.geteuid(), **probe()}
            except PermissionError as exc:
                result = {"setuid_failed": str(exc)} if os.geteuid() != uid else {"error": repr(exc)}
            except Exception as exc:  # the parent asserts on it
                result = {"error": repr(exc)}
            with os.fdopen(write_end, "wb") as out:
                out.write(json.dumps(result).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as source:
        data = source.read()
    _, wait_status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(wait_status) == 0
    seen: dict[str, Any] = json.loads(data)
    if "setuid_failed" in seen:
        pytest.skip(f"cannot run as uid {uid}: {seen['setuid_failed']}")
    assert "error" not in seen, seen["error"]
    assert seen["uid"] == uid
    return seen
