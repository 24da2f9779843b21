"""A wheel (non-editable install) carries the shipped models and serves them by default."""

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from service.testing import ServerProcess, http_request
from tests.infer_utils import ROOT

SHIPPED = "service.shipped_models"


def test_the_package_list_names_every_package() -> None:
    # pyproject lists packages explicitly (the shipped models are mapped from onnx/): none may be forgotten
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for top in ("service", "models") for init in (ROOT / top).rglob("__init__.py")}
    assert listed == found | {SHIPPED}


def test_wheel_serves_the_shipped_models(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("posenc-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for model in ("rope_attention", "llama3_1_attention"):
        assert f"service/shipped_models/{model}/model.onnx" in names
        assert f"service/shipped_models/{model}/config.json" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # as installed: the package alone on the path, run from elsewhere (no source checkout in sight)
    code = ("from service.settings import Settings\n"
            "settings = Settings()\n"
            "assert settings.model_repository.parts[-2:] == ('service', 'shipped_models'), settings.model_repository\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(site)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    with ServerProcess(base_env={}, pythonpath=[site], cwd=tmp_path, ready="/readyz", ready_timeout=120) as server:
        assert http_request(server.port, "/readyz")[0] == 200
        assert http_request(server.port, "/v2/models/llama3_1_attention/ready")[0] == 200
