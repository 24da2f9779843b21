"""The explorer page: served at / and /explorer, same-origin only (the browser test drives it:
scripts/browser-test.sh), and `posenc table` writes the same pictures as the routes."""

import re
from pathlib import Path

from fastapi.testclient import TestClient

from posenc.service.cli.main import main


def test_page_and_assets_are_served_same_origin(client: TestClient) -> None:
    for path in ("/", "/explorer"):
        page = client.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    html = client.get("/").text
    assets = re.findall(r'(?:src|href)="(/explorer/[^"]+)"', html)
    assert sorted(assets) == ["/explorer/explorer.css", "/explorer/explorer.js"]
    for asset in assets:
        body = client.get(asset)
        assert body.status_code == 200
        assert not re.search(r"https?://", body.text), f"{asset} names another host"
    assert client.get("/explorer/missing.js").status_code == 404
    assert client.get("/explorer/index.html").status_code == 404


def test_page_names_only_routes_that_exist(client: TestClient) -> None:
    script = client.get("/explorer/explorer.js").text
    paths = set(client.get("/openapi.json").json()["paths"])
    named = set(re.findall(r'"(/v1/[a-z0-9/]+)"', script))
    assert named and named <= paths, named - paths


def test_posenc_table_writes_the_same_picture(tmp_path: Path, client: TestClient) -> None:
    out = tmp_path / "alibi.png"
    params = ["num_heads=4", "query_length=1", "key_length=32"]
    assert main(["table", "/v1/properties/alibi", *params, "-o", str(out)]) == 0
    served = client.get("/v1/properties/alibi?" + "&".join(params) + "&format=png")
    assert out.read_bytes() == served.content
