"""The wheel: it carries the shipped models and serves them by default, and everything it installs lives
under the one name `posenc`, so a project with its own `models` and `service` packages keeps them."""

import subprocess
import sys
import zipfile
from pathlib import Path

from posenc.service.testing import ServerProcess, http_request
from tests import onnx_models
from tests.deploy.conftest import venv_with_wheel
from tests.onnx_models import ROOT

SHIPPED = "posenc.service.shipped_models"


def test_the_wheel_holds_every_module_of_the_tree(wheel: Path) -> None:
    # setup.py derives the packages from the tree: a module added anywhere under service/ or models/ ships,
    # under posenc/, without a list to keep
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"posenc/{path.relative_to(ROOT).as_posix()}" for top in ("service", "models")
                for path in (ROOT / top).rglob("*.py") if "__pycache__" not in path.parts}
    assert expected, "no module found under service/ or models/"
    assert expected - names == set()


def test_wheel_serves_the_shipped_models(wheel: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for model in onnx_models.SHIPPED:
        assert f"posenc/service/shipped_models/{model}/model.onnx" in names
        assert f"posenc/service/shipped_models/{model}/config.json" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # as installed: the package alone on the path, run from elsewhere (no source checkout in sight)
    code = ("from posenc.service.settings import Settings\n"
            "settings = Settings()\n"
            "assert settings.model_repository.parts[-2:] == ('service', 'shipped_models'), settings.model_repository\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with ServerProcess(base_env={}, pythonpath=[site], cwd=tmp_path, ready="/readyz", ready_timeout=120) as server:
        assert http_request(server.port, "/readyz")[0] == 200
        assert http_request(server.port, "/v2/models/llama3_1_attention/ready")[0] == 200


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"posenc"}


# A user's project: its own `models` and `service` packages, and its tests import posenc beside them.
USER_PACKAGES = {"models/__init__.py": "OWNER = 'the user'\n", "service/__init__.py": "OWNER = 'the user'\n",
                 "service/settings.py": "DATABASE = 'users.db'\n"}
USER_CODE = """
import models, service, service.settings
import posenc, posenc.models.rope, posenc.service.settings
from fastapi.testclient import TestClient

assert models.OWNER == service.OWNER == "the user" and service.settings.DATABASE == "users.db"
assert posenc.models.rope.__file__.startswith(SITE), posenc.models.rope.__file__
assert posenc.Settings is posenc.service.settings.Settings
with TestClient(posenc.create_app(posenc.Settings())) as client:
    answer = client.get("/v1/rope", params={"max_position": 4, "head_dim": 8, "format": "json"})
    assert answer.status_code == 200, answer.text
assert models.OWNER == "the user" and "models" not in dir(posenc.service)
print("both sides import")
"""


def test_the_wheel_beside_a_projects_own_models_and_service(wheel: Path, tmp_path: Path) -> None:
    python, site = venv_with_wheel(wheel, tmp_path / "venv")
    project = tmp_path / "project"
    for name, text in USER_PACKAGES.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    (project / "check_imports.py").write_text(f"SITE = {site!r}\n" + USER_CODE)
    result = subprocess.run([str(python), "check_imports.py"], cwd=project, capture_output=True, text=True,
                            timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "both sides import"
