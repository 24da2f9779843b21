"""Shared-memory access for tests, benchmarks and scripts: the restricted-API key a TCP client sends, and
sealed memfds (the zero-copy objects a Unix-socket client registers as `fd:N`, sending the descriptor).

    settings = {"shared_memory": True, **shared_memory_key_settings()}   # for ServerProcess / Settings
    client.register_system_shared_memory(name, key, size, headers=SHARED_MEMORY_HEADERS)
    fd = sealed_memfd(size); register_memfd("/run/posenc.sock", name, fd, size)   # on the Unix socket
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping

from posenc.service.testing.http import Response, unix_http_request

SHARED_MEMORY_KEY_HEADER = "posenc-shared-memory-key"
SHARED_MEMORY_KEY = "posenc-test-kit"  # a test value: a deployment chooses its own secret
SHARED_MEMORY_HEADERS = {SHARED_MEMORY_KEY_HEADER: SHARED_MEMORY_KEY}


def shared_memory_key_settings(header: str = SHARED_MEMORY_KEY_HEADER, key: str = SHARED_MEMORY_KEY) -> dict[str, str]:
    """The POSENC_RESTRICTED_API setting under which TCP clients sending `header: key` may use shared memory."""
    return {"restricted_api": f"shared-memory:{header}={key}"}


def sealed_memfd(size: int, name: str = "posenc") -> int:
    """A memfd of `size` zero bytes, sealed against shrinking and growing: the server maps it (zero copy),
    since no truncation can pull a page from under a run. The caller closes it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def memfd_key(fd: int) -> str:
    """The register key of the client's own descriptor `fd` (accepted over the Unix socket only, with the
    descriptor itself sent along: `register_memfd`)."""
    return f"fd:{fd}"


def register_memfd(socket_path: str, name: str, fd: int, byte_size: int, offset: int = 0,
                   headers: Mapping[str, str] | None = None, timeout: float = 60) -> Response:
    """Register region `name` of the memfd (or any shared-memory descriptor) `fd` over the Unix socket at
    `socket_path`: the descriptor travels with the request (SCM_RIGHTS on a new connection), and the server
    keeps its own copy, with the access `fd` was opened with. Status, headers, body."""
    body = json.dumps({"key": memfd_key(fd), "offset": offset, "byte_size": byte_size}).encode()
    return unix_http_request(socket_path, f"/v2/systemsharedmemory/region/{name}/register", "POST", body,
                             headers=headers, timeout=timeout, fds=[fd])
