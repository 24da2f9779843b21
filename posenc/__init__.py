"""posenc: positional-encoding tables, attention biases and ONNX RoPE-attention inference over HTTP.

Everything importable lives under this one name, so an install never collides with a project's own
`models` or `service` package: `posenc.models` is the numeric core (pure functions returning numpy arrays,
no HTTP), `posenc.service` the HTTP service built on it. The names below are the public Python API; they
are imported on first use, so `import posenc.models.rope` does not load the web stack.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from posenc.service import __version__

if TYPE_CHECKING:
    from posenc.service.http.app import create_app
    from posenc.service.settings import Settings

# public name -> the module that defines it
_PUBLIC: dict[str, str] = {
    "create_app": "posenc.service.http.app",
    "Settings": "posenc.service.settings",
}

__all__ = ["Settings", "__version__", "create_app"]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'posenc' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
