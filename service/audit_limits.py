"""What an audit reads at most: the defaults and floor of `POSENC_AUDIT_MAX_HEADER_BYTES` and
`POSENC_AUDIT_MAX_ONNX_BYTES` (the settings' fields read them here), and those bounds without the settings, for a
`posenc audit` run that sets neither (building the service's settings imports pydantic-settings, most of a
command's start-up)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

MiB = 1024 * 1024
MAX_HEADER_BYTES = 64 * MiB  # a GGUF or safetensors header: metadata and vocabulary (256k tokens: a few MiB)
MAX_ONNX_BYTES = 64 * MiB  # an ONNX or JSON upload, held whole to parse
FLOOR_BYTES = 1024  # the smallest bound either may be set to
ENV_PREFIX = "POSENC_AUDIT_"  # the variables of these bounds (the settings read them case-insensitively)


class AuditBounds(Protocol):
    """The two bounds, as the settings hold them."""

    @property
    def audit_max_header_bytes(self) -> int: ...

    @property
    def audit_max_onnx_bytes(self) -> int: ...


@dataclass(frozen=True)
class DefaultBounds:
    """The bounds when no `POSENC_AUDIT_*` variable is set."""

    audit_max_header_bytes: int = MAX_HEADER_BYTES
    audit_max_onnx_bytes: int = MAX_ONNX_BYTES


def bounds_are_default(environ: Mapping[str, str] = os.environ) -> bool:
    """True when no variable could change a bound, so the defaults hold without building (and validating) the
    settings."""
    return not any(name.upper().startswith(ENV_PREFIX) for name in environ)
