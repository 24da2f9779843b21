"""A project of a user's own, outside the repository: its own `models` package, posenc installed from the wheel,
and a pytest suite with no conftest.py that uses the four fixtures of the plugin (posenc_app, posenc_client,
posenc_table, posenc_server), including a client under test run as a subprocess against posenc_server.

Its tests are the worked examples of docs/python.md, as they stand there (each fenced block with a `title`),
plus a Python program as the subprocess client; the C++ example (the repository's C++ client) joins where g++,
libcurl and nlohmann/json are installed. Marked `server`: the project's suite starts a live server."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import venv_with_wheel
from tests.onnx_models import ROOT

pytestmark = pytest.mark.server

DOCS_PAGE = ROOT / "docs" / "python.md"
EXAMPLE = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```$', re.M | re.S)
CPP_EXAMPLE = {"tests/rope_dump.cpp", "tests/test_rope_dump.py"}

OWN_MODELS = {
    "models/__init__.py": '"""The project\'s own models package."""\nOWNER = "the sample project"\n',
    "models/attention.py": "def scale(head_dim: int) -> float:\n    return head_dim ** -0.5\n",
}

OWN_TESTS = '''
import subprocess
import sys

import numpy as np

import models
import models.attention
import posenc

# A client under test that runs as its own process and knows nothing but the URL: raw little-endian bytes.
PROGRAM = """
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/v1/rope?max_position=16&head_dim=8&tensor=cos&format=raw") as answer:
    sys.stdout.buffer.write(answer.read())
"""


def test_both_models_packages_import():
    assert models.OWNER == "the sample project" and models.attention.scale(16) == 0.25
    assert posenc.__file__.startswith(SITE), posenc.__file__
    assert posenc.models.rope.__name__ == "posenc.models.rope"


def test_a_subprocess_client_against_the_live_server(posenc_server, posenc_table):
    printed = subprocess.run([sys.executable, "-c", PROGRAM, posenc_server.url], capture_output=True, check=True,
                             timeout=60).stdout
    golden = posenc_table("/v1/rope", max_position=16, head_dim=8)["cos"]
    np.testing.assert_array_equal(np.frombuffer(printed, np.float32).reshape(16, 8), golden)


def test_the_app_is_the_tests_own(posenc_app, posenc_client):
    assert posenc_client.app is posenc_app
    assert posenc_client.get("/readyz").status_code == 200
'''


def docs_examples() -> dict[str, str]:
    """The titled code blocks of docs/python.md: path in the project → its text."""
    return {path: text for path, text in EXAMPLE.findall(DOCS_PAGE.read_text())}


def cpp_client_builds(where: Path) -> bool:
    """Whether the repository's C++ client can be built here: g++, nlohmann/json found by the preprocessor (not
    compiled: it is a large header), libcurl linked."""
    if shutil.which("g++") is None:
        return False
    probe = where / "probe.cpp"
    probe.write_text("#include <curl/curl.h>\n#include <nlohmann/json.hpp>\nint main() { return 0; }\n")
    steps = (["g++", "-std=c++17", "-E", str(probe), "-o", str(where / "probe.ii")],
             ["g++", "-x", "c++", "-", "-lcurl", "-o", str(where / "probe")])
    return all(subprocess.run(step, input=b"#include <curl/curl.h>\nint main() { return 0; }\n",
                              capture_output=True, timeout=120).returncode == 0 for step in steps)


def test_the_docs_hold_the_examples() -> None:
    assert {"tests/test_my_rope.py", *CPP_EXAMPLE} <= set(docs_examples())


def test_a_project_of_its_own_uses_the_fixtures(wheel: Path, tmp_path: Path) -> None:
    python, site = venv_with_wheel(wheel, tmp_path / "venv")
    project = tmp_path / "project"
    with_cpp = cpp_client_builds(tmp_path)
    files = {**OWN_MODELS, "tests/test_own.py": f"SITE = {site!r}\n" + OWN_TESTS,
             **{path: text for path, text in docs_examples().items() if with_cpp or path not in CPP_EXAMPLE}}
    for name, text in files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    assert not list(project.rglob("conftest.py"))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "POSENC_CPP_CLIENT": str(ROOT / "clients" / "cpp")}
    result = subprocess.run([str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "tests"],
                            cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    passed = set(re.findall(r"^PASSED (\S+)", result.stdout, re.M))
    expected = {"tests/test_own.py::test_both_models_packages_import",
                "tests/test_own.py::test_a_subprocess_client_against_the_live_server",
                "tests/test_own.py::test_the_app_is_the_tests_own",
                "tests/test_my_rope.py::test_my_rope_matches_the_golden_table[10000.0]",
                "tests/test_my_rope.py::test_my_rope_matches_the_golden_table[500000.0]",
                "tests/test_my_rope.py::test_the_check_agrees",
                "tests/test_my_rope.py::test_posenc_inside_my_own_app"}
    if with_cpp:
        expected.add("tests/test_rope_dump.py::test_rope_dump_prints_the_golden_table")
    assert passed == expected, result.stdout[-3000:]
