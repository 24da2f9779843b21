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
# Layer types judged apart, each with a RoPE of its own: a config.json's per-layer-type rope_parameters (the file
# audited or the reference), a checkpoint's `{layer_type}_inv_freq` buffers, an extract's `layers`. Models have two or
# three (Gemma: full and sliding attention; DeepSeek-V4: main and compress). Each costs a reference resolved, an audit
# and its tables (about 10 kB of report) and transformers' resolver reads the whole rope dict for each: past this
# bound a file is refused before any of it is resolved (10,000 layer types took minutes of CPU and a gigabyte).
MAX_LAYER_TYPES = 16
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
