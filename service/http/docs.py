"""Interactive API docs (`/docs` Swagger UI, `/redoc` ReDoc) that work without internet access.

FastAPI's default pages load Swagger UI and ReDoc from a CDN, so they are blank in an offline
cluster. These pages load the same assets from the service itself: the files bundled by the
`fastapi-offline` package (Swagger UI, ReDoc standalone, favicon; MIT), served by `ASSET_PATH`.
ReDoc's Google fonts and Swagger UI's online validator badge are off, and ReDoc's sidebar logo
(fetched from Redocly's CDN, with no option to turn it off) is replaced by an empty inline image:
no request leaves the host.
"""

from functools import cache
from importlib.resources import files
from importlib.resources.abc import Traversable

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from posenc.service.errors import NotFound

router = APIRouter(include_in_schema=False)

ASSET_PATH = "/docs/assets"
# Served name -> media type; nothing else in the package directory is reachable.
ASSETS: dict[str, str] = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
# Assets are versioned with the installed package, so browsers may keep them for a day.
ASSET_CACHE_CONTROL = "public, max-age=86400"


def asset_dir() -> Traversable:
    """The directory of the bundled Swagger UI / ReDoc files."""
    return files("fastapi_offline") / "static"


# URLs inside the bundled assets that a browser would fetch from elsewhere -> same-document stand-ins.
OFFSITE_URLS: dict[str, dict[bytes, bytes]] = {
    "redoc.standalone.js": {
        b"https://cdn.redoc.ly/redoc/logo-mini.svg":
            b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg' width='1' height='1'/%3E",
    },
}


@cache
def asset_bytes(name: str) -> bytes:
    """The bytes of one known asset, read once per process (about 2.8 MB for all four)."""
    body = (asset_dir() / name).read_bytes()
    for offsite, local in OFFSITE_URLS.get(name, {}).items():
        body = body.replace(offsite, local)
    return body


def asset_url(request: Request, name: str) -> str:
    """Same-origin URL of asset `name`, honouring a mount prefix (`root_path`)."""
    return f"{request.scope.get('root_path', '').rstrip('/')}{ASSET_PATH}/{name}"


def openapi_url(request: Request) -> str:
    return f"{request.scope.get('root_path', '').rstrip('/')}{request.app.openapi_url}"


@router.get("/docs", response_class=HTMLResponse)
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=openapi_url(request),
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=asset_url(request, "swagger-ui-bundle.js"),
        swagger_css_url=asset_url(request, "swagger-ui.css"),
        swagger_favicon_url=asset_url(request, "favicon.png"),
        # null: no badge image fetched from the public validator service.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/redoc", response_class=HTMLResponse)
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=openapi_url(request),
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=asset_url(request, "redoc.standalone.js"),
        redoc_favicon_url=asset_url(request, "favicon.png"),
        with_google_fonts=False,
    )


@router.get(ASSET_PATH + "/{name}")
async def docs_asset(name: str) -> Response:
    """One bundled asset by name; 404 for any other name (no path from the request reaches the filesystem)."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no docs asset {name!r}; assets: {', '.join(sorted(ASSETS))}")
    return Response(asset_bytes(name), media_type=media_type, headers={"Cache-Control": ASSET_CACHE_CONTROL})
