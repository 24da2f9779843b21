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
    from posenc.service.client import (
        AsyncClient,
        BadRequestError,
        Client,
        InvalidParameterError,
        NotAcceptableError,
        NotFoundError,
        PayloadTooLargeError,
        PosencError,
        Table,
        UnavailableError,
    )
    from posenc.service.http.app import create_app
    from posenc.service.http.in_process import table
    from posenc.service.settings import Settings

# public name -> the module that defines it (docs/python.md lists them; the client's other errors are in
# posenc.client)
_PUBLIC: dict[str, str] = {
    "create_app": "posenc.service.http.app",
    "Settings": "posenc.service.settings",
    "table": "posenc.service.http.in_process",
    "Client": "posenc.service.client",
    "AsyncClient": "posenc.service.client",
    "Table": "posenc.service.client",
    "PosencError": "posenc.service.client",
    "BadRequestError": "posenc.service.client",
    "InvalidParameterError": "posenc.service.client",
    "NotFoundError": "posenc.service.client",
    "NotAcceptableError": "posenc.service.client",
    "PayloadTooLargeError": "posenc.service.client",
    "UnavailableError": "posenc.service.client",
}

__all__ = [  # the names of _PUBLIC (tests/api/test_python_api.py keeps them equal)
    "AsyncClient",
    "BadRequestError",
    "Client",
    "InvalidParameterError",
    "NotAcceptableError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PosencError",
    "Settings",
    "Table",
    "UnavailableError",
    "__version__",
    "create_app",
    "table",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'posenc' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
