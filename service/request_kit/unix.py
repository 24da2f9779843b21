"""Who the peer of a Unix-domain-socket connection (`POSENC_UDS`) is: `Peer`, as the protocol puts it in every
request's scope (the socket itself and the reading of the credentials: `posenc.service.http.unix_socket`).

Over TCP the server cannot tell who a client is. On a Unix socket the kernel tells it (SO_PEERCRED: the pid,
uid and gid of the process that connected; SO_PEERGROUPS: its supplementary groups), as they were when it
connected. Nothing is looked up through the pid, which another process may own by the time it is read. The
protocol (`posenc.service.http.protocol`) reads them once per connection and puts them in every request's scope under
`PEER_SCOPE_KEY`; shared memory judges access by them (`posenc.service.inference.shared_memory.guard`).
"""

from __future__ import annotations

from dataclasses import dataclass

PEER_SCOPE_KEY = "posenc.peer"


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a Unix-socket connection, as the kernel saw it when it connected."""

    pid: int
    uid: int
    gids: frozenset[int]  # primary and supplementary groups

    def describe(self) -> str:
        return f"uid {self.uid} (pid {self.pid})"
