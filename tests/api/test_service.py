"""App-level behaviour: error envelope everywhere, health, OpenAPI documentation, layout rules."""

import importlib.machinery
from pathlib import Path

import pytest
from fastapi import APIRouter
from fastapi.testclient import TestClient

from posenc.service.http.app import create_app
from posenc.service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_health(client: TestClient) -> None:
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/readyz").status_code == 200


def test_not_ready_before_startup() -> None:
    client = TestClient(create_app(Settings()))  # no context manager: lifespan has not run
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "not ready"


def test_unknown_route_is_404_envelope(client: TestClient) -> None:
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json() == {"error": "no route GET /v1/nothing", "type": "not_found"}


def test_wrong_method_is_405_envelope(client: TestClient) -> None:
    r = client.post("/v1/sinusoidal")
    assert r.status_code == 405 and r.json()["type"] == "method_not_allowed"


def test_unexpected_errors_are_a_generic_500(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(Settings())
    router = APIRouter()

    @router.get("/boom")
    def boom() -> None:
        raise RuntimeError("secret internal detail")

    app.include_router(router)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/boom")
    assert r.status_code == 500 and r.json()["type"] == "internal"
    assert "secret" not in r.text
    assert "secret internal detail" in caplog.text


def test_every_parameter_is_documented(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert client.get("/docs").status_code == 200
    checked = 0
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            for param in operation.get("parameters", []):
                assert param.get("description"), f"{path}: {param['name']} has no description"
                if not param.get("required"):
                    # an optional parameter has a real default, or is nullable: absent means "not given";
                    # format and tensor default to what Accept and the endpoint say
                    nullable = {"type": "null"} in param["schema"].get("anyOf", [])
                    negotiated = param["name"] in ("format", "tensor")
                    assert "default" in param["schema"] or nullable or negotiated, (path, param)
                checked += 1
    assert checked >= 9
    dim = next(p for p in spec["paths"]["/v1/sinusoidal"]["get"]["parameters"] if p["name"] == "dim")
    assert dim["schema"]["minimum"] == 1 and dim["schema"]["maximum"] == 65536


def test_onnx_folder_holds_artefacts_only(tmp_path: Path) -> None:
    # A Python package named `onnx` would shadow the real onnx library.
    onnx_dir = ROOT / "onnx"
    assert not list(onnx_dir.rglob("*.py"))
    # With the repository first on the path (as when running from its root) and an onnx library installed
    # after it, `import onnx` finds the library: the folder is at most a namespace portion, never a package.
    library = tmp_path / "site-packages" / "onnx" / "__init__.py"
    library.parent.mkdir(parents=True)
    library.touch()
    spec = importlib.machinery.PathFinder.find_spec("onnx", [str(ROOT), str(tmp_path / "site-packages")])
    assert spec is not None and spec.origin == str(library)


def test_service_does_not_import_torch() -> None:
    for path in (ROOT / "service").rglob("*.py"):
        text = path.read_text()
        assert "import torch" not in text and "from torch" not in text, path
