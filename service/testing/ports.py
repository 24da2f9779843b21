"""Loopback ports: a free one for a server, and the check that keeps test traffic on this host."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
LOOPBACK_NAMES = frozenset({"127.0.0.1", "::1", "localhost"})


def free_port(host: str = LOOPBACK) -> int:
    """A port on `host` that was free a moment ago (the kernel picks it; another process may take it first)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def require_loopback(host: str) -> str:
    """`host` itself when it names this machine's loopback interface; a ValueError otherwise (the kit's
    servers and load never leave the host)."""
    if host not in LOOPBACK_NAMES:
        raise ValueError(f"{host!r} is not a loopback address: the test kit only talks to this host "
                         f"({', '.join(sorted(LOOPBACK_NAMES))})")
    return host
