"""Every per-rope_type rule lives in the registry: no module of service/ or models/ but models/rope_types.py
spells a rope_type (a registry key or a config.json alias of one) as a string constant. A branch on a
name elsewhere is a rule the registry does not know about; docstrings and comments may name types."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from posenc.models.rope_types import CONFIG_ALIASES, ROPE_TYPES

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "models/rope_types.py"
ROPE_TYPE_NAMES = frozenset(ROPE_TYPES) | frozenset(CONFIG_ALIASES)
# (file, string) pairs where the string means something other than a rope_type
ALLOWED = {
    # logging.config.dictConfig: the name of the formatter and of the handler the loggers use
    ("service/http/logs.py", "default"),
    # public models' config.json fields, copied as published (data the registry parses, not a rule)
    ("models/export/shipped_models.py", "yarn"),
    ("models/export/shipped_models.py", "longrope"),
}


def _documentation(tree: ast.AST) -> set[int]:
    """ids of the string constants that are whole statements: docstrings (module, class, function,
    attribute), which no code reads."""
    return {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def rope_type_literals(source: str) -> Iterator[tuple[int, str]]:
    """(line, string) of every string constant in `source` equal to a rope_type name, docstrings left out."""
    tree = ast.parse(source)
    documentation = _documentation(tree)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ROPE_TYPE_NAMES
                and id(node) not in documentation):
            yield node.lineno, node.value


def test_no_module_outside_the_registry_names_a_rope_type() -> None:
    found = []
    for folder in ("service", "models"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == REGISTRY:
                continue
            found += [f"{name}:{line}: {value!r}" for line, value in rope_type_literals(path.read_text())
                      if (name, value) not in ALLOWED]
    assert not found, "rope_type names outside models/rope_types.py (a rule for the registry):\n" + "\n".join(found)


def test_the_search_finds_names_in_code_and_skips_documentation() -> None:
    some_type, alias = next(iter(ROPE_TYPES)), next(iter(CONFIG_ALIASES))
    source = (f'"""Module docs name {some_type!r}."""\n'
              f"def f(p):\n"
              f'    """{some_type}"""\n'
              f"    return p.rope_type == {some_type!r} or p.rope_type in ({alias!r},)\n"
              f"X = 1\n"
              f'"""{some_type}"""\n')
    assert sorted(rope_type_literals(source)) == sorted([(4, some_type), (4, alias)])


def test_the_registry_itself_names_every_type() -> None:
    registry = {value for _, value in rope_type_literals((ROOT / REGISTRY).read_text())}
    assert registry == ROPE_TYPE_NAMES


def test_the_api_offers_the_registry_types() -> None:
    from posenc.service.tables.rope import RopeQuery

    offered = RopeQuery.model_json_schema()["properties"]["rope_type"]["enum"]
    assert offered == [name for name, spec in ROPE_TYPES.items() if not spec.engine_variant]


def test_the_explorer_takes_the_rope_types_from_the_service() -> None:
    script = (ROOT / "service/http/static/explorer/explorer.js").read_text()
    named = sorted(name for name in ROPE_TYPE_NAMES if re.search(rf"[\"']{name}[\"']", script))
    assert not named, f"explorer.js lists rope types {named}; it reads them from /openapi.json"
