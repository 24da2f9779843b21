"""The public Python API: the names posenc exports (imported lazily), and docs/python.md naming each of them, every
dotted posenc name it cites, every table endpoint, every client error with its status and type, and every fixture
of the pytest plugin."""

from __future__ import annotations

import importlib
import re

import pytest

import posenc
from posenc import pytest_plugin
from posenc.client import ERRORS
from posenc.service.tables import TABLES
from tests.conftest import assert_runs_in_fresh_python
from tests.onnx_models import ROOT

PAGE = (ROOT / "docs" / "python.md").read_text()


def test_all_names_the_public_map() -> None:
    assert sorted(posenc.__all__) == sorted([*posenc._PUBLIC, "__version__"])
    for name in posenc._PUBLIC:
        assert getattr(posenc, name).__name__ == name


def test_the_public_api_is_imported_on_first_use() -> None:
    code = ("import sys, posenc, posenc.models.rope\n"
            "assert 'fastapi' not in sys.modules and 'httpx2' not in sys.modules, 'posenc loaded the web stack'\n"
            "assert posenc.Client.__module__ == 'posenc.service.client'\n")
    assert_runs_in_fresh_python(code)


def test_the_page_names_every_public_name() -> None:
    missing = [name for name in posenc._PUBLIC if f"posenc.{name}" not in PAGE]
    assert not missing


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("dotted", sorted(set(re.findall(r"`(posenc(?:\.\w+)+)", PAGE))))
def test_every_dotted_name_on_the_page_exists(dotted: str) -> None:
    assert _resolve(dotted) is not None


def test_the_page_lists_every_table_endpoint() -> None:
    rows = re.findall(r"^\| (`/v1/[^|]*)\|", PAGE, re.M)
    listed = {path for row in rows for path in re.findall(r"`(/v1/[^`]+)`", row)}
    assert listed == set(TABLES)


def test_the_error_table_is_the_clients() -> None:
    rows = set(re.findall(r"^\| `(\w+Error)` \| (\d+) \| `(\w+)`", PAGE, re.M))
    assert rows == {(cls.__name__, str(cls.service_error.status_code), cls.service_error.error_type) for cls in ERRORS}


def test_the_fixture_table_is_the_plugins() -> None:
    rows = set(re.findall(r"^\| `(posenc_\w+)` \|", PAGE, re.M))
    plugin = {name for name in dir(pytest_plugin) if name.startswith("posenc_")}
    assert rows == plugin and len(rows) == 6
