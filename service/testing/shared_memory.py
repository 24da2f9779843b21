"""Shared-memory access for tests, benchmarks and scripts: the restricted-API key a TCP client sends, and
sealed memfds (the zero-copy objects a Unix-socket client registers as `fd:N`).

    settings = {"shared_memory": True, **shared_memory_key_settings()}   # for ServerProcess / Settings
    client.register_system_shared_memory(name, key, size, headers=SHARED_MEMORY_HEADERS)
"""

from __future__ import annotations

import fcntl
import os

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
    """The register key of the client's own descriptor `fd` (accepted over the Unix socket only)."""
    return f"fd:{fd}"
