"""The explorer page: `GET /` and `GET /explorer` (one static page, its script and style sheet).

No build step and nothing fetched from elsewhere: the page draws the table and its properties from
the service's own `format=png` pictures and `format=json` summaries, and shows the exact URL and a
curl command for what is on screen. Files come from `service/http/static/explorer/` (package data).
"""

from functools import cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

from posenc.service.errors import NotFound

router = APIRouter(include_in_schema=False)

# Served name -> media type; nothing else in the folder is reachable.
FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "explorer.js": "text/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
}
# Same-origin everything: the page cannot load or send anything elsewhere.
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@cache
def explorer_file(name: str) -> bytes:
    return (files("posenc.service.http") / "static" / "explorer" / name).read_bytes()


def _file(name: str) -> Response:
    return Response(explorer_file(name), media_type=FILES[name],
                    headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})


@router.get("/")
@router.get("/explorer")
def explorer_page() -> Response:
    return _file("index.html")


@router.get("/explorer/{name}")
def explorer_asset(name: str) -> Response:
    if name not in FILES or name == "index.html":
        raise NotFound(f"no explorer file {name!r}")
    return _file(name)
