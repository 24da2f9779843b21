"""The calibration cache: the CPU-graph rules measured at start-up (`calibration`), by `cache_key`, in one JSON file.

    {"<cache key>": {"rule": [[1, "model.onnx"], [65, "model.cpu.onnx"]], "sequences": [16, 32, ...],
                     "ms": {"model.onnx": [0.12, ...], ...}, "measured_at": 1700000000.0}, ...}

The file is data, never trusted beyond what it can be checked for. It is read only when its folder and the file
itself (symlinks followed, the opened file checked: a Kubernetes ConfigMap is a chain of links) belong to the
server's user or to root and are writable by no one else, except on a read-only mount (a ConfigMap's folder is
root's and 0777, mounted read-only); it is opened non-blocking (a FIFO planted as the file never stalls a start)
and must be a regular file of at most MAX_BYTES, nesting at most MAX_DEPTH deep (checked before json.loads: a
file of "[" * 100000 raises nothing), with at most MAX_ENTRIES entries and rules of at most MAX_RULE_STEPS steps.
It is written only into a folder of the server's user that no one else may write to (created 0700), through a
new temporary file (O_EXCL | O_NOFOLLOW, mode 0600, the pid and a random token in its name: never a link
someone planted there) renamed over the file. Anything else means no cache: the rule is measured again, and the
reason is logged once per file and process. `writable=False` reads a file of rules an administrator mounted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import secrets
import stat
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posenc.models.graph_rule import Rule, valid_rule

log = logging.getLogger("posenc.inference.calibration")

MAX_BYTES = 1 << 20  # about 700 entries of 5 graphs and 7 lengths as written (indented)
MAX_DEPTH = 8  # a cache file nests 4 deep: {key: {"rule": [[1, "model.onnx"]]}}
MAX_ENTRIES = 1024  # keys: CPU x threads x models; the writer keeps the newest
MAX_RULE_STEPS = 64  # a measured rule has a step per calibrated length at most (calibration.SEQUENCES: 7)
ROOT = 0
SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH
_STRUCTURE = re.compile(r'[\[\]{}"\\]')  # the characters the nesting scan looks at
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


class Refused(Exception):
    """The file's content is not a bounded cache (the message says why)."""


class Untrusted(Refused):
    """The file or its folder may have been written by someone else than the server's user or root."""


def nesting_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep JSON `text`'s arrays and objects nest (brackets in strings not counted), counted up to limit + 1:
    a linear scan, so json.loads never meets text deeper than `limit`. Invalid JSON gets some number; json.loads
    then refuses it."""
    depth = deepest = 0
    in_string, escaped_at = False, -1
    for match in _STRUCTURE.finditer(text):
        char, at = match.group(), match.start()
        if in_string:
            if at == escaped_at:
                continue
            if char == "\\":
                escaped_at = at + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


def parse_entries(data: bytes) -> dict[str, Any]:
    """The entries (cache key -> entry) of a cache file's bytes; Refused when they are not a JSON object within
    MAX_BYTES, MAX_DEPTH and MAX_ENTRIES."""
    if len(data) > MAX_BYTES:
        raise Refused(f"over {MAX_BYTES} bytes")
    try:
        text = data.decode()
        if nesting_depth(text) > MAX_DEPTH:
            raise Refused(f"nested over {MAX_DEPTH} deep")
        entries = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: a backstop, the scan refuses such text first
        raise Refused(f"not UTF-8 JSON: {str(exc)[:200]}") from None
    if not isinstance(entries, dict):
        raise Refused("not a JSON object")
    if len(entries) > MAX_ENTRIES:
        raise Refused(f"over {MAX_ENTRIES} entries")
    return entries


def cached_rule(entry: Any, files: Sequence[str]) -> Rule | None:
    """The rule of one entry when it is one over `files` of at most MAX_RULE_STEPS steps; else None."""
    rule = entry.get("rule") if isinstance(entry, dict) else None
    if not isinstance(rule, list) or len(rule) > MAX_RULE_STEPS:
        return None
    return valid_rule(rule, files)


def untrusted_because(st: os.stat_result, owners: Sequence[int], read_only_mount: bool) -> str | None:
    """Why a file or folder of this stat may hold what someone else wrote (None: it cannot): owned by none of
    `owners`, or writable by its group or others on a writable mount."""
    if st.st_uid not in owners:
        return f"owned by uid {st.st_uid}, not {' or '.join(str(uid) for uid in owners)}"
    if st.st_mode & SHARED_WRITE and not read_only_mount:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _check(fd: int, what: str, owners: Sequence[int], read_only_ok: bool) -> os.stat_result:
    """fstat of `fd`; Untrusted when `untrusted_because` says so (a read-only mount's mode bits count when
    not `read_only_ok`)."""
    st = os.fstat(fd)
    read_only = read_only_ok and bool(os.fstatvfs(fd).f_flag & os.ST_RDONLY)
    if (why := untrusted_because(st, owners, read_only)) is not None:
        raise Untrusted(f"its {what} is {why}")
    return st


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, size = [], 0
    while size < limit and (chunk := os.read(fd, min(limit - size, 1 << 16))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_trusted(path: Path) -> bytes:
    """The bytes of `path` (at most MAX_BYTES + 1) when it is a regular file and it and its folder are the server
    user's or root's, writable by no one else (mode bits on a read-only mount aside); Untrusted, Refused or
    OSError else (FileNotFoundError: no cache yet)."""
    owners = (os.geteuid(), ROOT)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _check(folder, "folder", owners, read_only_ok=True)
        # O_NONBLOCK: opening a FIFO planted as the cache returns at once (refused below) instead of waiting
        fd = os.open(path.name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=folder)
    finally:
        os.close(folder)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted("not a regular file")
        _check(fd, "file", owners, read_only_ok=True)
        if st.st_size > MAX_BYTES:
            raise Refused(f"over {MAX_BYTES} bytes")
        return _read_at_most(fd, MAX_BYTES + 1)  # +1: a file grown since fstat is still seen to be too large
    finally:
        os.close(fd)


def open_own_folder(folder: Path) -> int:
    """A descriptor of `folder` (created 0700 with missing parents) when it is the server user's and no one else
    may write to it, reached through no symlink of someone else's; Untrusted or OSError else."""
    euid = os.geteuid()
    try:
        os.makedirs(folder, mode=0o700)
        created = True
    except FileExistsError:
        created = False
    link = os.lstat(folder)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (euid, ROOT):
        raise Untrusted(f"its folder is a symlink of uid {link.st_uid}")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if created and os.fstat(fd).st_uid == euid:
            os.fchmod(fd, 0o700)  # the umask may have taken the owner's bits
        _check(fd, "folder", (euid,), read_only_ok=False)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _token() -> str:
    """The random part of a temporary file's name (tests replace it to plant a link at the exact name)."""
    return secrets.token_hex(8)


def write_replacing(path: Path, data: bytes) -> None:
    """`data` as `path`, atomically (a concurrent start reads the old file or the new one), through a new 0600
    temporary file in `open_own_folder(path.parent)`; nothing is written through a link, and the temporary
    file is removed when anything fails."""
    folder = open_own_folder(path.parent)
    try:
        temporary = f".{path.name}.{os.getpid()}.{_token()}"
        # O_EXCL | O_NOFOLLOW: a file or link already at that name fails the open, and is not ours to remove
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temporary, flags, 0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
            raise
    finally:
        os.close(folder)


def _measured_at(item: tuple[str, Any]) -> float:
    value = item[1].get("measured_at") if isinstance(item[1], dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return 0.0  # unknown: among the first to go


def file_bytes(entries: Mapping[str, Any]) -> bytes:
    """The cache file of `entries`: the first, then the newest by measured_at, as many as MAX_ENTRIES and
    MAX_BYTES allow (the writer never writes what the reader refuses); Refused when the first alone is too large."""
    first, *others = entries.items()
    kept = [first, *sorted(others, key=_measured_at, reverse=True)][:MAX_ENTRIES]
    while True:
        data = (json.dumps(dict(kept), indent=1, sort_keys=True) + "\n").encode()
        if len(data) <= MAX_BYTES:
            return data
        if len(kept) == 1:
            raise Refused(f"one entry over {MAX_BYTES} bytes")
        kept = kept[:max(1, len(kept) * MAX_BYTES // len(data))]


def _warn_once(path: Path, what: str, message: str, *args: object) -> None:
    """Log `message` the first time this process has `what` to say about `path`: every model reads the cache."""
    with _warned_lock:
        if (seen := (str(path), what)) in _warned:
            return
        _warned.add(seen)
    log.warning(message, path, *args)


class CalibrationCache:
    """Rules by `cache_key` in one JSON file (module docstring): a file that cannot be trusted, read or written is
    no cache (logged once). `path` None: no cache; `writable` False: `put` writes nothing."""

    def __init__(self, path: Path | None, writable: bool = True) -> None:
        self.path = path
        self.writable = writable

    def _entries(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            return parse_entries(read_trusted(self.path))
        except FileNotFoundError:
            return {}
        except Untrusted as exc:
            _warn_once(self.path, "trust", "calibration cache %s not used (%s): measuring again, not cached", exc)
        except (OSError, Refused) as exc:
            _warn_once(self.path, "read", "calibration cache %s ignored (%s): measuring again", exc)
        return {}

    def get(self, key: str, files: Sequence[str]) -> Rule | None:
        """The rule cached for `key`, if it is one over `files` (the model's graphs); None: measure again."""
        entries = self._entries()
        if key not in entries:
            return None
        if (rule := cached_rule(entries[key], files)) is None:
            assert self.path is not None  # entries come from a file
            _warn_once(self.path, "read", "calibration cache %s ignored (%s): measuring again",
                       f"the entry for {key!r} is no rule of at most {MAX_RULE_STEPS} steps over {', '.join(files)}")
        return rule

    def put(self, key: str, entry: Mapping[str, Any]) -> None:
        """Record `entry` ({"rule": ..., "measured_at": ...}) for `key`, keeping the newest other entries."""
        if self.path is None or not self.writable:
            return
        entries = {key: dict(entry), **{other: value for other, value in self._entries().items() if other != key}}
        try:
            write_replacing(self.path, file_bytes(entries))
        except Untrusted as exc:
            _warn_once(self.path, "trust", "calibration cache %s not used (%s): measuring again, not cached", exc)
        except (OSError, Refused) as exc:
            _warn_once(self.path, "write", "calibration cache %s not written (%s)", exc)
