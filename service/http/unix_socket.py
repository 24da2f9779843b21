"""The Unix-domain socket (`POSENC_UDS`): binding it, and reading who connected (SO_PEERCRED, SO_PEERGROUPS) as a
`posenc.service.request_kit.unix.Peer`."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct
from pathlib import Path
from typing import Any

from posenc.service.request_kit.unix import Peer

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13; Python names it from 3.12 on some builds
PEER_GROUPS_BYTES = 1024  # the most Python's getsockopt reads: 256 groups


def supplementary_groups(sock: Any) -> frozenset[int]:
    """The peer's supplementary groups when it connected (SO_PEERGROUPS). Empty where the kernel does not
    tell them or the peer has more than 256: the peer is then judged by its uid and primary group only,
    which can refuse it access, never grant more."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, PEER_GROUPS_BYTES)
    except OSError as exc:
        if exc.errno not in (errno.ENOPROTOOPT, errno.ERANGE, errno.EINVAL):
            raise
        return frozenset()
    return frozenset(struct.unpack(f"{len(raw) // 4}I", raw[:len(raw) // 4 * 4]))


def peer_of(sock: Any) -> Peer | None:
    """The peer of a connected Unix socket (None for any other socket)."""
    if sock is None or getattr(sock, "family", None) != socket.AF_UNIX:
        return None
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return Peer(pid, uid, frozenset({gid}) | supplementary_groups(sock))


def bind_unix_socket(path: Path, backlog: int = 2048) -> socket.socket:
    """A listening Unix socket at `path`, mode 0666: any local user may connect, since the server judges each
    peer by its credentials (a directory's mode can still narrow who reaches it). A stale socket file left by
    an earlier run is replaced; any other file at `path` is an error, never removed."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise SystemExit(f"POSENC_UDS: {path} exists and is not a socket; choose another path")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, 0o666)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise SystemExit(f"POSENC_UDS: cannot listen on {path}: {exc.strerror}") from None
    sock.set_inheritable(True)  # uvicorn's worker processes receive it
    return sock
