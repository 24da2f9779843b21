"""Module names say what a module holds: none of the catch-all names (core, common, utils, helpers, misc) in
the code base, its tests, the benchmark or the scripts."""

from __future__ import annotations

from pathlib import Path

from tests.onnx_models import ROOT

FOLDERS = ("service", "models", "posenc", "tests", "bench", "scripts")
CATCH_ALL = {"core", "common", "utils", "util", "helpers", "misc"}


def catch_all_modules(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for folder in FOLDERS for path in (root / folder).rglob("*.py")
                  if path.stem in CATCH_ALL or path.stem.endswith(("_utils", "_helpers", "_common")))


def test_no_module_has_a_catch_all_name() -> None:
    assert catch_all_modules(ROOT) == []


def test_a_catch_all_name_is_found(tmp_path: Path) -> None:
    for name in ("service/check/core.py", "tests/infer_utils.py", "models/properties/common.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert catch_all_modules(tmp_path) == ["models/properties/common.py", "service/check/core.py",
                                           "tests/infer_utils.py"]


def test_the_tables_package_names_its_machinery_and_every_other_module_registers_a_table() -> None:
    """service/tables imports every module outside MACHINERY as a family: a family registers a table (its query
    model's module), the machinery none."""
    import pkgutil

    import posenc.service.tables as tables

    registering = {route.query.__module__.rsplit(".", 1)[1] for route in tables.TABLES.values()
                   if route.query.__module__.startswith(tables.__name__ + ".")}
    modules = {module.name for module in pkgutil.iter_modules(tables.__path__)}
    assert modules >= tables.MACHINERY, tables.MACHINERY - modules
    assert modules - tables.MACHINERY == registering
