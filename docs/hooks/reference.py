"""mkdocs hook: reference tables generated from the code at build time, so the docs cannot drift from it.

A page holds a marker line `<!-- reference:NAME -->` and the hook replaces it with the Markdown table NAME:
- configuration: every `posenc.service.settings.Settings` field (POSENC_ env name, type, default, range, description);
- errors: every class of the error taxonomy (`service/errors.py`) with its HTTP status, type and docstring,
  plus the answers `service/http/errors.py` gives outside it (validation, unknown route, wrong method);
- endpoints: every route of the OpenAPI document of `posenc.service.http.app.create_app()`;
- rope_types: every entry of `posenc.models.rope_types.ROPE_TYPES` (the fields it reads, the config.json keys);
- grpc_status: the gRPC status code of every class of the error taxonomy (`posenc.service.errors.GRPC_CODE_NAMES`).
`render(name)` is what the tests call, without mkdocs.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- reference:([a-z_]+) -->$", re.MULTILINE)


def _cell(text: object) -> str:
    """One table cell: a single line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _type_name(annotation: Any) -> str:
    name = getattr(annotation, "__name__", None)
    text = name if name and not getattr(annotation, "__args__", None) else str(annotation)
    return text.replace("typing.", "").replace("pathlib.", "")


def _range(field: Any) -> str:
    bounds = []
    for item in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"),
                           ("max_length", "length ≤")):
            value = getattr(item, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
    return ", ".join(bounds)


def configuration() -> str:
    from posenc.service.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    rows = []
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        rows.append([f"`{(prefix + name).upper()}`", f"`{_type_name(field.annotation)}`",
                     f"`{default!r}`" if default not in (None, "") else "—", _range(field),
                     field.description or ""])
    return _table(["env", "type", "default", "range", "description"], rows)


def errors() -> str:
    from posenc.service import errors as taxonomy

    classes = [cls for _, cls in inspect.getmembers(taxonomy, inspect.isclass)
               if issubclass(cls, taxonomy.ServiceError) and cls.__module__ == taxonomy.__name__]
    classes.sort(key=lambda cls: cls.status_code)
    rows = [[str(cls.status_code), f"`{cls.error_type}`", f"`{cls.__name__}`",
             inspect.cleandoc(cls.__dict__.get("__doc__") or "")] for cls in classes]
    # Answers service/http/errors.py gives for errors raised outside the taxonomy (by FastAPI or Starlette).
    rows += [["422", "`invalid_parameter`", "validation", "A query parameter or body field fails its declared "
              "type or bounds; the message lists each failing field."],
             ["408", "`request_timeout`", "server", "A request body stalled for longer than POSENC_BODY_TIMEOUT; "
              "the connection is closed (service/http/protocol.py)."],
             ["404", "`not_found`", "routing", "No route has this path."],
             ["405", "`method_not_allowed`", "routing", "The route exists but not with this method."]]
    return _table(["status", "type", "raised as", "when"], rows)


def endpoints() -> str:
    from posenc.service.http.app import create_app

    document = create_app().openapi()
    rows = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            formats = sorted({media for response in operation.get("responses", {}).values()
                              for media in response.get("content", {})})
            rows.append([method.upper(), f"`{path}`", operation.get("summary", ""),
                         ", ".join(f"`{media}`" for media in formats)])
    return _table(["method", "path", "summary", "formats"], rows)


def rope_types() -> str:
    from posenc.models.rope_types import ROPE_TYPES

    rows = [[f"`{name}`", ", ".join(f"`{f}`" for f in sorted(spec.reads)) or "—",
             ", ".join(f"`{f}`" for f in spec.required) or "—",
             ", ".join(f"`{k}`" for k in sorted(spec.config_keys))]
            for name, spec in ROPE_TYPES.items()]
    return _table(["rope_type", "fields read", "required", "config.json keys"], rows)


def presets() -> str:
    from posenc.models.presets import catalogue

    rows = [[f"`{p.name}`", p.family, f"[{p.model_id}](https://huggingface.co/{p.model_id})",
             "; ".join(f"{label}: {', '.join(keys)}" for label, keys in p.read_from.items())]
            for p in catalogue().values()]
    return _table(["preset", "family", "public model", "read from"], rows)


def grpc_status() -> str:
    from posenc.service import errors as taxonomy
    from posenc.service.grpc.servicer import grpc_status as status_of

    classes = [cls for _, cls in inspect.getmembers(taxonomy, inspect.isclass)
               if issubclass(cls, taxonomy.ServiceError) and cls.__module__ == taxonomy.__name__]
    classes.sort(key=lambda cls: cls.status_code)
    rows = []
    for cls in classes:
        variants = [("", {})]
        if issubclass(cls, taxonomy.Unavailable):  # not ready, and overloaded (a full queue or memory budget)
            variants = [(" (not ready)", {}), (" (overloaded: a queue or the memory budget is full)",
                                               {"overloaded": True})]
        for label, flags in variants:
            error = cls.__new__(cls)
            error.headers = {"Retry-After": "1"} if issubclass(cls, taxonomy.Unavailable) else {}
            error.__dict__.update(flags or ({"overloaded": False} if label else {}))
            code, trailing = status_of(error)
            rows.append([str(cls.status_code), f"`{cls.__name__}`{label}", f"`{code.name}`",
                         "`retry-after`" if trailing else "—"])
    return _table(["HTTP status", "error", "gRPC status", "trailing metadata"], rows)


TABLES: dict[str, Callable[[], str]] = {"configuration": configuration, "errors": errors,
                                        "endpoints": endpoints, "rope_types": rope_types, "presets": presets,
                                        "grpc_status": grpc_status}


def render(name: str) -> str:
    return TABLES[name]()


def fill(markdown: str) -> str:
    """The page with every marker replaced by its table (an unknown name raises: a typo fails the build)."""
    return MARKER.sub(lambda match: render(match.group(1)), markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return fill(markdown)
