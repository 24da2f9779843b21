"""/docs and /redoc load nothing from outside the service (no CDN, fonts or validator badge).

The browser-level check (a headless chromium with the network blocked) is scripts/browser-test.sh.
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from posenc.service.http.docs import ASSET_PATH, ASSETS

# src="..." / href="..." and url: '...' / spec-url="..." in the generated pages.
URL_ATTRIBUTE = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|\burl:\s*["']([^"']+)["']""")


def referenced_urls(html: str) -> list[str]:
    return [a or b for a, b in URL_ATTRIBUTE.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_reference_only_local_urls(client: TestClient, page: str) -> None:
    response = client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    urls = referenced_urls(response.text)
    assert any(url.startswith(ASSET_PATH + "/") for url in urls), urls
    assert "/openapi.json" in urls
    for url in urls:
        # Same origin only: an absolute path, never a scheme or a protocol-relative host.
        assert url.startswith("/") and not url.startswith("//"), f"{page} loads {url}"
    # Nothing in the page text names another host either (e.g. a font or validator URL in a script).
    assert "http://" not in response.text and "https://" not in response.text
    for url in urls:
        if url.startswith(ASSET_PATH):
            assert client.get(url).status_code == 200, url


def test_swagger_ui_validator_badge_is_off(client: TestClient) -> None:
    assert '"validatorUrl": null' in client.get("/docs").text


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_docs_assets_are_served(client: TestClient, name: str) -> None:
    response = client.get(f"{ASSET_PATH}/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"].split(";")[0] == ASSETS[name].split(";")[0]
    assert len(response.content) > 1000
    if name.endswith(".js"):
        assert response.headers["content-type"].startswith("text/javascript")


def test_unknown_docs_asset_is_a_404_envelope(client: TestClient) -> None:
    for name in ("nope.js", "..%2F..%2Fpyproject.toml", "__init__.py"):
        response = client.get(f"{ASSET_PATH}/{name}")
        assert response.status_code == 404, name
        assert response.json()["type"] == "not_found"


def test_docs_routes_stay_out_of_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith(("/docs", "/redoc"))]


def test_redoc_bundle_has_no_cdn_logo(client: TestClient) -> None:
    """ReDoc renders its sidebar logo from Redocly's CDN unconditionally; the served bundle points it inward."""
    body = client.get(f"{ASSET_PATH}/redoc.standalone.js").content
    assert b"cdn.redoc.ly" not in body
    assert b"data:image/svg+xml," in body
