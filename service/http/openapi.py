"""The OpenAPI document, made to describe what the service really sends and accepts.

FastAPI's generated document knows the routes and parameters; this module adds what it cannot infer:
the `{error, type}` envelope on every error status a route can answer (instead of FastAPI's
`{detail}` 422), the media type of every table format, the allowed values of `format` and
`tensor`, the 304 of conditional requests, and the infer request body (JSON and the binary tensor
extension). Generated clients and fuzzers (schemathesis runs in CI) work from it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from posenc.models.dtypes import BY_KSERVE
from posenc.service.check.request import accepted_tensors
from posenc.service.check.routes import CHECK_FORMATS
from posenc.service.codec.encode import FORMATS, MEDIA_TYPES
from posenc.service.inference.codecs.kserve_request import HEADER_LENGTH
from posenc.service.inference.runtime.repository import VERSION
from posenc.service.tables.preset import PRESET_FILLS, preset_fills, preset_names
from posenc.service.tables.registry import TableQuery, table_routes

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error", "type"],
    "properties": {"error": {"type": "string", "description": "What was wrong and what is allowed."},
                   "type": {"type": "string", "description": "Short code of the error class."}},
    "additionalProperties": True,
}
ERROR_MEANING = {
    400: "Malformed request or body", 403: "A restricted protocol group without its header, or shared memory "
    "without the right to it", 404: "Unknown route or model", 406: "Unsupported format",
    412: "If-None-Match matched (POST)", 413: "Request or response over a configured limit",
    415: "Unsupported upload media type", 422: "Invalid parameter value (the message names it)",
    503: "Not ready, or overloaded (Retry-After)", 507: "Out of memory for this request (the model's device, "
    "or shared-memory mappings)",
}
TABLE_ERRORS = (400, 406, 413, 422, 503)
UPLOAD_ERRORS = (*TABLE_ERRORS, 412, 415)
# 403: a protocol group restricted by POSENC_RESTRICTED_API, or shared memory used without the right to.
V2_ERRORS = (403, 404, 503)
INFER_ERRORS = (400, 403, 404, 413, 503, 507)
READINESS_ERRORS = (503,)
CHECK_ERRORS = UPLOAD_ERRORS  # /v1/check/...: the table's own parameters and an upload
MODEL_CHECK_ERRORS = (*INFER_ERRORS, 422)
# off, bad key or range; no right to the object; unknown region; over the bound; no descriptor or mapping left
SHARED_MEMORY_ERRORS = (400, 403, 404, 413, 503, 507)
INDEX_ERRORS = (400, 403, 422)  # a body that is not JSON; restricted; `ready` not a boolean
AUDIT_ERRORS = (400, 413, 422, 503)  # an unreadable or hostile file or preset; over a bound; a format; no memory

_BINARY = {"type": "string", "format": "binary"}
_JSON_TABLE = {
    "type": "object",
    "properties": {"tensors": {"type": "object", "additionalProperties": {
        "type": "object", "properties": {"dtype": {"type": "string"}, "shape": {"type": "array",
                                         "items": {"type": "integer"}}, "data": {"type": "array"}}}},
                   "metadata": {"type": "object", "additionalProperties": {"type": "string"}}},
}
_INFER_TENSOR = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "datatype": {"type": "string", "enum": list(BY_KSERVE)},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "data": {"type": "array", "description": "Row-major values, flat or nested."},
        "parameters": {"type": "object", "properties": {"binary_data_size": {"type": "integer", "minimum": 0}}},
    },
}
INFER_BODY = {
    "required": True,
    "description": "A KServe v2 infer request: JSON, or (binary tensor extension) a JSON header of "
                   f"`{HEADER_LENGTH}` bytes followed by the raw little-endian tensors in input order.",
    "content": {
        "application/json": {"schema": {
            "type": "object", "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "inputs": {"type": "array", "minItems": 1, "items": _INFER_TENSOR},
                "outputs": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {
                    "name": {"type": "string"},
                    "parameters": {"type": "object", "properties": {"binary_data": {"type": "boolean"}}}}}},
                "parameters": {"type": "object", "properties": {"binary_data_output": {"type": "boolean"}}},
            }}},
        "application/octet-stream": {"schema": _BINARY},
    },
}


def _errors(statuses: tuple[int, ...]) -> dict[str, Any]:
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    return {str(status): {"description": ERROR_MEANING[status], "content": body} for status in statuses}


def _presets(operation: dict[str, Any], query: type[TableQuery]) -> None:
    """`preset` lists the slugs that fill this route's table (another model's slug is a 422 there); a route no preset
    fills does not declare it (any name is refused). A required parameter that every preset of the route fills says
    that a request with `preset` may leave it out."""
    names = preset_names(query.preset_table) if query.preset_table is not None else []
    filled = preset_fills(query.preset_table) if query.preset_table is not None else frozenset()
    parameters = operation.get("parameters", [])
    for parameter in parameters:
        if parameter["in"] != "query":
            continue
        if parameter["name"] == "preset":
            schema = parameter["schema"]
            described = {key: schema[key] for key in ("description", "title") if key in schema}
            parameter["schema"] = {"anyOf": [{"type": "string", "enum": names}, {"type": "null"}], **described}
        elif parameter.get("required") and parameter["name"] in filled:
            # required, so that a client that sends it is never refused for its absence; with a preset it may be
            # left out (a rule across parameters that OpenAPI cannot state: the description says it)
            parameter["description"] = f"{parameter.get('description', '')} {PRESET_FILLS}".lstrip()
    if not names:
        operation["parameters"] = [p for p in parameters if not (p["name"] == "preset" and p["in"] == "query")]


def _table_operation(operation: dict[str, Any], path: str) -> None:
    route = table_routes()[path]
    operation["responses"] = {
        "200": {"description": operation["responses"]["200"]["description"] + " Media type by `format` / Accept.",
                "content": {MEDIA_TYPES[f]: {"schema": _JSON_TABLE if f == "json" else _BINARY} for f in FORMATS}},
        "304": {"description": "If-None-Match matched the ETag (GET)."},
        **_errors(UPLOAD_ERRORS if route.query.body is not None else TABLE_ERRORS),
    }
    for parameter in operation.get("parameters", []):
        if parameter["name"] == "format":
            parameter["schema"] = {"type": "string", "enum": list(FORMATS)}
        elif parameter["name"] == "tensor":
            parameter["schema"] = {"type": "string", "enum": list(route.query.tensors)}
    _presets(operation, route.query)


def _check_operation(operation: dict[str, Any], path: str) -> None:
    """A check route: its errors, and the formats and upload tensor names it accepts."""
    operation["responses"].update(_errors(CHECK_ERRORS))
    route = table_routes()["/v1/" + path.removeprefix("/v1/check/")]
    for parameter in operation.get("parameters", []):
        if parameter["name"] == "format":
            parameter["schema"] = {"type": "string", "enum": list(CHECK_FORMATS)}
        elif parameter["name"] == "tensor":
            parameter["schema"] = {"type": "string", "enum": list(accepted_tensors(route))}
    _presets(operation, route.query)


def _path_enums(operation: dict[str, Any], models: list[str]) -> None:
    """{name} lists the repository's models (when it has any) and {version} the one version: an unknown
    one is then outside the document as it is outside the service (404)."""
    for parameter in operation.get("parameters", []):
        if parameter["in"] == "path" and parameter["name"] == "name" and models:
            parameter["schema"] = {**parameter["schema"], "enum": models}
        elif parameter["in"] == "path" and parameter["name"] == "version":
            parameter["schema"] = {**parameter["schema"], "enum": [VERSION]}


def _hoist_defs(node: Any, schemas: dict[str, Any]) -> Any:
    """Inline pydantic schemas (`model_json_schema()` in an operation) carry `$defs` and `#/$defs/X` references,
    which OpenAPI tools cannot resolve: move every definition to components/schemas and point there."""
    if isinstance(node, list):
        return [_hoist_defs(item, schemas) for item in node]
    if not isinstance(node, dict):
        return node
    for name, definition in node.pop("$defs", {}).items():
        schemas.setdefault(name, _hoist_defs(definition, schemas))
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        node["$ref"] = "#/components/schemas/" + ref.removeprefix("#/$defs/")
    return {key: _hoist_defs(value, schemas) for key, value in node.items()}


def _describe(spec: dict[str, Any], models: list[str]) -> dict[str, Any]:
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    spec["paths"] = _hoist_defs(spec["paths"], schemas)
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["Error"] = ERROR_SCHEMA
    for path, operations in spec["paths"].items():
        for operation in operations.values():
            operation["responses"].pop("422", None)  # FastAPI's {detail}: the service never sends it
            if path in table_routes():
                _table_operation(operation, path)
            elif path.startswith("/v1/check/"):
                _check_operation(operation, path)
            elif path.startswith("/v2/models/") and path.endswith("/check"):
                operation["responses"].update(_errors(MODEL_CHECK_ERRORS))
            elif path.startswith("/v2/systemsharedmemory"):
                operation["responses"].update(_errors(SHARED_MEMORY_ERRORS))
            elif path == "/v1/audit":
                operation["responses"]["200"]["content"]["image/png"] = {"schema": _BINARY}
                operation["responses"].update(_errors(AUDIT_ERRORS))
            elif path == "/v2/repository/index":
                operation["responses"].update(_errors(INDEX_ERRORS))
            elif path.endswith("/infer"):
                operation["requestBody"] = INFER_BODY
                operation["responses"]["200"]["content"] = {"application/json": {"schema": {"type": "object"}},
                                                            "application/octet-stream": {"schema": _BINARY}}
                operation["responses"].update(_errors(INFER_ERRORS))
            elif path.startswith("/v2/models/"):
                operation["responses"].update(_errors(V2_ERRORS))
            elif path in ("/readyz", "/v2/health/ready"):
                restricted = (403,) if path.startswith("/v2/") else ()  # the health group may be restricted
                operation["responses"].update(_errors((*restricted, *READINESS_ERRORS)))
            if any(p["in"] == "path" for p in operation.get("parameters", [])):
                _path_enums(operation, models)
                operation["responses"].update(_errors((404,)))  # an unknown model or version
    return spec


def install_openapi(app: FastAPI) -> None:
    """Replace `app.openapi` by the described document (built on request, cached once the models are loaded)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        engine = app.state.process.engine
        models = sorted(engine.models) if engine is not None else []
        spec = _describe(get_openapi(title=app.title, version=app.version, description=app.description,
                                     routes=app.routes), models)
        if engine is not None:
            app.openapi_schema = spec
        return spec

    setattr(app, "openapi", openapi)  # noqa: B010 - FastAPI's documented way to customise the document

