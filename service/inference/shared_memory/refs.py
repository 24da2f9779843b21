"""What a request names in shared memory (`ShmRef`), and the refusal when the extension is off: the types the
protocol codecs hand to the registry (`posenc.service.inference.shared_memory.registry`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHARED_MEMORY_OFF = ("the system shared-memory extension is off: start posenc with POSENC_SHARED_MEMORY=true to "
                     "use it (clients on the same host only; see docs/inference.md, \"Shared memory\")")


@dataclass(frozen=True)
class ShmRef:
    """`byte_size` bytes at `offset` of the registered shared-memory region `region`."""

    region: str
    offset: int
    byte_size: int

    def parameters(self, byte_size: int) -> dict[str, Any]:
        """The tensor parameters of a response entry whose `byte_size` bytes were written here."""
        params: dict[str, Any] = {"shared_memory_region": self.region, "shared_memory_byte_size": byte_size}
        if self.offset:
            params["shared_memory_offset"] = self.offset
        return params
