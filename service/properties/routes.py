"""`GET /v1/properties/...`: every properties endpoint the modules of this room register (importing the room
registers them), answered by the tables' path: formats, ETag, cache and limits."""

from fastapi import APIRouter

from posenc.service.tables.registry import PROPERTIES
from posenc.service.tables.routes import add_table_routes


def properties_router() -> APIRouter:
    """Every registered properties route."""
    return add_table_routes(APIRouter(tags=["properties"]), PROPERTIES.values())
