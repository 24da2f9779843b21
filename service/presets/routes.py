"""`GET /v1/presets` and `GET /v1/presets/{preset}`: the bundled catalogue of public model configurations.

The list names each preset's family, the table routes `?preset=` fills and where its values were read; one
preset's document adds its facts, the resolved parameters of each of its routes and golden URLs (GET routes
with `?preset=` and the lengths the model does not fix). The catalogue and its resolution are
`posenc.models.presets`; which route serves which table kind is each query model's `preset_table`.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from posenc.models.errors import ParameterError
from posenc.models.presets import SOURCES, Preset, catalogue, find_preset
from posenc.models.presets.tables import preset_values
from posenc.service.check.request import check_path, checkable
from posenc.service.errors import NotFound
from posenc.service.tables.registry import TABLES, TableRoute, table_routes

router = APIRouter(tags=["presets"])

GOLDEN_LENGTH = 64  # query/key lengths (and RoPE rows) of a golden URL: the model fixes none of them
GOLDEN_GRID = "1,16,16"  # the image grid of a vision tower's golden URL (a multiple of every merge size served)
# the lengths a golden URL of each table kind adds (RoPE: the rows, the model's whole context by default)
GOLDEN_SIZES: dict[str, dict[str, int | str]] = {
    "rope": {"max_position": GOLDEN_LENGTH}, "vision_rope": {}, "vision_tower": {"grid_thw": GOLDEN_GRID},
    "sinusoidal": {"max_position": GOLDEN_LENGTH},
    "alibi": {"query_length": GOLDEN_LENGTH, "key_length": GOLDEN_LENGTH},
    "t5": {"query_length": GOLDEN_LENGTH, "key_length": GOLDEN_LENGTH},
    "deberta": {"query_length": GOLDEN_LENGTH, "key_length": GOLDEN_LENGTH},
    "xlnet": {"qlen": GOLDEN_LENGTH, "klen": GOLDEN_LENGTH},
}


def preset_routes(preset: Preset) -> list[TableRoute]:
    """The table and properties routes `?preset=` fills for this preset."""
    return [route for route in table_routes().values() if route.query.preset_table in preset.tables]


def _route_names(preset: Preset) -> list[str]:
    routes = preset_routes(preset)
    checks = [check_path(route) for route in routes if route.path in TABLES and checkable(route)]
    return [f"{route.method} {route.path}" for route in routes] + [f"POST {path}" for path in checks]


def _provenance(preset: Preset) -> dict[str, Any]:
    return {"model_id": preset.model_id, "url": f"https://huggingface.co/{preset.model_id}",
            "read_from": {label: list(keys) for label, keys in preset.read_from.items()}}


def _summary(preset: Preset) -> dict[str, Any]:
    return {"name": preset.name, "family": preset.family, "model_id": preset.model_id,
            "endpoints": _route_names(preset), "provenance": _provenance(preset)}


def _golden_urls(preset: Preset) -> list[str]:
    urls = []
    for route in preset_routes(preset):
        kind = route.query.preset_table
        if route.method == "GET" and kind is not None and kind in GOLDEN_SIZES:
            sizes = {name: value for name, value in GOLDEN_SIZES[kind].items() if name in route.query.model_fields}
            urls.append(f"{route.path}?{urlencode({'preset': preset.name, **sizes})}")
    return urls


def preset_document(preset: Preset) -> dict[str, Any]:
    """One preset: its facts, the resolved parameters of each of its routes, golden URLs."""
    parameters: dict[str, dict[str, Any]] = {}
    for route in preset_routes(preset):
        assert route.query.preset_table is not None  # preset_routes selects routes with a table kind
        values = preset_values(preset, route.query.preset_table)
        parameters[f"{route.method} {route.path}"] = {k: v for k, v in values.items() if k in route.query.model_fields}
    return {**_summary(preset), "config": dict(preset.config), "serving": dict(preset.serving),
            "parameters": parameters, "golden_urls": _golden_urls(preset)}


@router.get("/v1/presets", summary="Every model preset: name, family, routes, provenance",
            response_description="`presets`: one entry per preset; `sources`: what each provenance label means.")
async def list_presets() -> JSONResponse:
    """The bundled catalogue of public model configurations; `?preset=NAME` on a table, properties or check
    route fills that route's model parameters from one of them."""
    return JSONResponse({"presets": [_summary(preset) for preset in catalogue().values()], "sources": dict(SOURCES)})


@router.get("/v1/presets/{preset:path}", summary="One model preset: its facts, resolved parameters and golden URLs",
            response_description="The preset's config facts with provenance, each route's resolved parameters and "
                                 "golden URLs.")
async def get_preset(preset: Annotated[str, Path(description="A preset name or the model's public id (any case).",
                                                 json_schema_extra={"enum": list(catalogue())})]) -> JSONResponse:
    """A preset by name or public id (case-insensitive); 404 for an unknown one."""
    try:
        found = find_preset(preset)
    except ParameterError as exc:
        raise NotFound(exc.message) from None
    return JSONResponse(preset_document(found))
