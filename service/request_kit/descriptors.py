"""Descriptors a Unix-socket client passes with its request (SCM_RIGHTS), for `fd:` shared-memory regions.

A client hands the server an object it holds (a memfd) by sending the descriptor itself, as ancillary data
of the first bytes of a new connection (`socket.send_fds`); the kernel gives the server its own descriptor
of the same open file, with the access the client opened it with. The server never looks a descriptor up
by the client's pid (`/proc/<pid>/fd/N`): that pid may belong to another process by then.

The event loop's transport reads with plain `recv`, which drops ancillary data, so the listener peeks at a
Unix connection's first byte with `recvmsg` before the transport takes the socket
(`posenc.service.http.descriptor_passing`).
What came with it belongs to the connection's first request (`PassedDescriptors`, in its scope under
`DESCRIPTORS_SCOPE_KEY`): a register with an `fd:` key takes it; whatever is not taken is closed when that
request is answered or the connection ends. At most `MAX_DESCRIPTORS` per connection; more is refused.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

DESCRIPTORS_SCOPE_KEY = "posenc.passed_descriptors"
MAX_DESCRIPTORS = 1


@dataclass(eq=False)
class PassedDescriptors:
    """The descriptors that came with a connection's first bytes; `refused` when the client sent more than
    `MAX_DESCRIPTORS` (the extra ones were never installed, and none is kept)."""

    fds: list[int] = field(default_factory=list)
    refused: bool = False

    def take(self) -> int | None:
        """The passed descriptor, now the caller's to close; None when none is left."""
        return self.fds.pop(0) if self.fds else None

    def close(self) -> None:
        """Close what was not taken."""
        fds, self.fds = self.fds, []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
