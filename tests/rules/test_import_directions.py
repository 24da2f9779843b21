"""The import directions of the code base, read from the source with `ast` (imports at any level, inside
functions too): models never imports service; the tables, properties, check and audit rooms never import
inference; inference never imports tables or properties; the assembly (posenc.service.http) is imported by
nothing below it (only the CLI and the test kit); only the assembly and the request kit's dependencies know the
app; every feature room declares its routes in one module, `routes.py`; the numeric core (models/ outside
models/export/) imports no torch and no onnx; the CLI imports no route module and no CLI module imports itself
back; nothing in service/ imports the test kit posenc.service.testing; the two transports (posenc.service.http and
posenc.service.grpc) import nothing of each other, and the process object they both take (posenc.service.process)
imports neither.

Each rule is also run on a planted violation, so none of them can pass by finding nothing to look at."""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.onnx_models import ROOT


@dataclass(frozen=True)
class Module:
    name: str  # dotted: posenc.service.tables.rope
    path: Path
    tree: ast.Module

    def imports(self) -> set[str]:
        """Every module this one imports, absolute and dotted (`from a import b` counts as a and a.b)."""
        package = self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    anchor = ".".join(parts[: len(parts) - node.level + 1])
                    base = f"{anchor}.{base}" if base else anchor
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        return found

    def imported_names(self) -> set[tuple[str, str]]:
        """(module, name) of every `from module import name`."""
        return {(node.module or "", alias.name) for node in ast.walk(self.tree)
                if isinstance(node, ast.ImportFrom) for alias in node.names}


def load_modules(root: Path, packages: tuple[str, ...] = ("models", "service")) -> list[Module]:
    modules = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(("posenc", *(parts[:-1] if parts[-1] == "__init__" else parts)))
            modules.append(Module(name, path, ast.parse(path.read_text(), filename=str(path))))
    return modules


def within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def _forbidden(modules: list[Module], rooms: tuple[str, ...], banned: tuple[str, ...]) -> Iterator[str]:
    for module in modules:
        if any(within(module.name, room) for room in rooms):
            for target in sorted(module.imports()):
                if any(within(target, ban) for ban in banned):
                    yield f"{module.name} imports {target}"


def models_never_import_service(modules: list[Module]) -> list[str]:
    return list(_forbidden(modules, ("posenc.models",), ("posenc.service",)))


def tables_properties_check_never_import_inference(modules: list[Module]) -> list[str]:
    return list(_forbidden(modules, ("posenc.service.tables", "posenc.service.properties", "posenc.service.check",
                                     "posenc.service.audit"), ("posenc.service.inference",)))


def inference_never_imports_tables(modules: list[Module]) -> list[str]:
    return list(_forbidden(modules, ("posenc.service.inference",),
                           ("posenc.service.tables", "posenc.service.properties")))


ASSEMBLY = "posenc.service.http"
SERVING = "posenc.service.serving"  # the process: the HTTP app and the gRPC server on one data plane
# Who may import the assembly: itself, the serving process, the CLI (`posenc serve`) and the test kit.
ASSEMBLY_USERS = (ASSEMBLY, SERVING, "posenc.service.cli", "posenc.service.testing")


def nothing_below_the_assembly_imports_it(modules: list[Module]) -> list[str]:
    rooms = [m for m in modules if within(m.name, "posenc") and not any(within(m.name, u) for u in ASSEMBLY_USERS)]
    return list(_forbidden(rooms, ("posenc",), (ASSEMBLY,)))


PROCESS = "posenc.service.process"  # the process object both transports take
TRANSPORTS = {"posenc.service.http": ("posenc.service.grpc", "grpc"), "posenc.service.grpc": ("posenc.service.http",
                                                                                             "fastapi", "starlette")}


def the_transports_know_only_the_process(modules: list[Module]) -> list[str]:
    """HTTP holds nothing of gRPC and gRPC nothing of HTTP; the process they share imports neither transport."""
    found = []
    for transport, banned in TRANSPORTS.items():
        found += _forbidden(modules, (transport,), banned)
    found += _forbidden(modules, (PROCESS,), (*TRANSPORTS, "fastapi", "starlette", "grpc"))
    return found


EXPORT_ROOM = "posenc.models.export"
HEAVY = ("torch", "onnx", "onnxscript", "onnxruntime", "transformers")


def the_numeric_core_imports_no_torch_or_onnx(modules: list[Module]) -> list[str]:
    core = [m for m in modules if within(m.name, "posenc.models") and not within(m.name, EXPORT_ROOM)]
    return list(_forbidden(core, ("posenc.models",), HEAVY))


APP_MODULES = ("posenc.service.http.app", "posenc.service.serving.process")  # the factories: create_app, app_from_env
APP_NAMES = {("fastapi", "FastAPI"), ("fastapi.applications", "FastAPI")}


# the typed dependencies, the shared ones and each room's own: app.state -> what a route needs
APP_STATE_READERS = ("posenc.service.request_kit.deps", "posenc.service.tables.deps", "posenc.service.inference.deps")


def _touches_app(node: ast.AST) -> bool:
    """`<x>.app.state` or `request.app`."""
    if not isinstance(node, ast.Attribute):
        return False
    if node.attr == "state" and isinstance(node.value, ast.Attribute) and node.value.attr == "app":
        return True
    return node.attr == "app" and isinstance(node.value, ast.Name) and node.value.id == "request"


def only_http_knows_the_app(modules: list[Module]) -> list[str]:
    found = []
    for module in modules:
        if within(module.name, ASSEMBLY) or within(module.name, SERVING) or module.name in APP_STATE_READERS:
            continue
        names = module.imported_names()
        found += [f"{module.name} imports {m}.{n}" for m, n in sorted(names & APP_NAMES)]
        found += [f"{module.name} imports {target}" for target in sorted(module.imports())
                  if any(within(target, app) for app in APP_MODULES)]
        found += [f"{module.name}:{node.lineno} reads {ast.unparse(node)}" for node in ast.walk(module.tree)
                  if _touches_app(node)]
    return found


def route_modules(modules: list[Module]) -> set[str]:
    """Modules that declare routes: they import fastapi's APIRouter (or build the app)."""
    routers = {("fastapi", "APIRouter"), ("fastapi.routing", "APIRouter")}
    return {m.name for m in modules if m.imported_names() & routers} | set(APP_MODULES)


FEATURE_ROOMS = ("tables", "properties", "check", "audit", "presets", "inference")


def each_feature_room_declares_its_routes_in_routes_py(modules: list[Module]) -> list[str]:
    routes = route_modules(modules) - set(APP_MODULES)
    found = [f"{name} declares routes outside a feature room's routes.py" for name in sorted(routes)
             if not any(name == f"posenc.service.{room}.routes" for room in FEATURE_ROOMS)
             and not within(name, ASSEMBLY)]
    return found


def cli_imports_no_route_module(modules: list[Module]) -> list[str]:
    routes = route_modules(modules)
    return [f"{module.name} imports the route module {target}" for module in modules
            if within(module.name, "posenc.service.cli") for target in sorted(module.imports()) if target in routes]


def cli_has_no_import_circle(modules: list[Module]) -> list[str]:
    cli = {m.name: m for m in modules if within(m.name, "posenc.service.cli")}
    graph = {name: {t for t in module.imports() if t in cli and t != name} for name, module in cli.items()}
    circles = []

    def visit(name: str, path: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in path:
                circle = [*path[path.index(target):], target]
                if circle[0] == min(circle[:-1]):  # each circle once, from its smallest name
                    circles.append(" → ".join(circle))
            else:
                visit(target, [*path, target])

    for name in sorted(graph):
        visit(name, [name])
    return sorted(set(circles))


def service_never_imports_the_test_kit(modules: list[Module]) -> list[str]:
    return [line for line in _forbidden(modules, ("posenc.service",), ("posenc.service.testing",))
            if not within(line.split()[0], "posenc.service.testing")]


RULES = [models_never_import_service, tables_properties_check_never_import_inference, inference_never_imports_tables,
         nothing_below_the_assembly_imports_it, the_numeric_core_imports_no_torch_or_onnx, only_http_knows_the_app,
         each_feature_room_declares_its_routes_in_routes_py, cli_imports_no_route_module, cli_has_no_import_circle,
         service_never_imports_the_test_kit, the_transports_know_only_the_process]


@pytest.fixture(scope="module")
def modules() -> list[Module]:
    return load_modules(ROOT)


def test_the_tree_holds_the_rooms_the_rules_name(modules: list[Module]) -> None:
    names = {m.name for m in modules}
    for room in ("posenc.models", "posenc.service.http", "posenc.service.grpc", PROCESS, "posenc.service.tables",
                 "posenc.service.properties", "posenc.service.check", "posenc.service.inference", "posenc.service.cli"):
        assert room in names, f"{room} is gone: the import rules below would check nothing there"
    routes = {"posenc.service.tables.routes", "posenc.service.check.routes", "posenc.service.inference.routes"}
    assert routes <= route_modules(modules)


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.__name__)
def test_import_direction(modules: list[Module], rule: object) -> None:
    assert callable(rule)
    assert rule(modules) == []


# One planted violation per rule: the module that breaks it, and its source.
PLANTED = {
    models_never_import_service: ("models/planted.py", "def f():\n    from posenc.service.errors import BadRequest\n"),
    tables_properties_check_never_import_inference: (
        "service/check/planted.py", "from ..inference import engine\n"),
    inference_never_imports_tables: ("service/inference/planted.py", "import posenc.service.tables.registry\n"),
    nothing_below_the_assembly_imports_it: ("service/request_kit/planted.py",
                                            "from posenc.service.http.metrics import install_metrics\n"),
    the_numeric_core_imports_no_torch_or_onnx: ("models/diagnosis/planted.py", "def f():\n    import onnx\n"),
    only_http_knows_the_app: ("service/tables/planted.py",
                              "async def route(request):\n    return request.app.state.process.settings\n"),
    each_feature_room_declares_its_routes_in_routes_py: (
        "service/tables/planted.py", "from fastapi import APIRouter\nrouter = APIRouter()\n"),
    cli_imports_no_route_module: ("service/cli/planted.py",
                                  "def f():\n    from posenc.service.check.routes import CHECK_FORMATS\n"),
    cli_has_no_import_circle: ("service/cli/settings_from_env.py", "from posenc.service.cli import main\n"),
    service_never_imports_the_test_kit: ("service/tables/planted.py", "from posenc.service.testing import kit\n"),
    the_transports_know_only_the_process: ("service/http/planted.py",
                                           "def f():\n    from posenc.service.grpc.server import grpc_recorder\n"),
}


def _planted(modules: list[Module], path: str, source: str) -> list[Module]:
    """The tree with `source` added to the module at `path` (a new module where there is none)."""
    name = ".".join(("posenc", *Path(path).with_suffix("").parts))
    original = next((m for m in modules if m.name == name), None)
    text = (original.path.read_text() if original else "") + source
    return [m for m in modules if m.name != name] + [Module(name, ROOT / path, ast.parse(text))]


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.__name__)
def test_each_rule_finds_a_planted_violation(modules: list[Module], rule: object) -> None:
    path, source = PLANTED[rule]  # type: ignore[index]
    assert callable(rule)
    found = rule(_planted(modules, path, source))
    assert found, f"{rule.__name__} missed {source!r} in {path}"
    assert all("planted" in line or "cli" in line for line in found), found


# Folders whose Python files import the code base: they must reach it through `posenc` only. A bare `models`
# or `service` would be this checkout's folder, not the installed package, and a project of the same name
# would shadow it.
IMPORTING_FOLDERS = ("service", "models", "posenc", "tests", "bench", "scripts", "docs")


def bare_top_level_imports(root: Path) -> list[str]:
    found = []
    for folder in IMPORTING_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if path.resolve() != path.absolute():  # posenc/service, posenc/models: read once, in their folders
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            targets = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            targets |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                        and node.level == 0}
            found += [f"{path.relative_to(root)} imports {target}" for target in sorted(targets)
                      if target.split(".")[0] in {"models", "service"}]
    return found


def test_the_code_base_is_imported_through_posenc_only() -> None:
    assert bare_top_level_imports(ROOT) == []


def test_a_bare_import_is_found(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "planted.py").write_text("from service.settings import Settings\nimport models.rope\n")
    assert bare_top_level_imports(tmp_path) == ["tests/planted.py imports models.rope",
                                                "tests/planted.py imports service.settings"]


def test_the_checkout_holds_no_symbolic_link() -> None:
    # setup.py maps service/ and models/ under posenc: tools that read paths see the files where they are
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert [line.split("\t")[1] for line in listed.splitlines() if line.startswith("120000")] == []
