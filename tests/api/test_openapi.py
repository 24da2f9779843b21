"""The OpenAPI document describes what the service sends and accepts (generated clients and schemathesis
work from it)."""

from fastapi.testclient import TestClient

from posenc.service.codec.encode import MEDIA_TYPES
from tests.onnx_models import SHIPPED


def test_every_error_status_has_the_envelope_schema(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    assert set(spec["components"]["schemas"]["Error"]["required"]) == {"error", "type"}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)


def test_tables_declare_their_media_types_and_errors(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v1/rope"]["get"]
    assert set(operation["responses"]["200"]["content"]) == set(MEDIA_TYPES.values())
    assert {"304", "400", "406", "413", "422", "503"} <= set(operation["responses"])
    parameters = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert parameters["tensor"]["enum"] == ["cos", "sin", "inv_freq"]
    assert parameters["format"]["enum"] == ["safetensors", "npy", "raw", "json", "png"]
    upload = client.get("/openapi.json").json()["paths"]["/v1/t5/bias"]["post"]
    assert {"412", "415"} <= set(upload["responses"]) and "requestBody" in upload


def test_infer_declares_its_body_and_the_models(client: TestClient) -> None:
    operation = client.get("/openapi.json").json()["paths"]["/v2/models/{name}/infer"]["post"]
    assert set(operation["requestBody"]["content"]) == {"application/json", "application/octet-stream"}
    name = next(p for p in operation["parameters"] if p["name"] == "name")
    assert name["schema"]["enum"] == list(SHIPPED)
    assert {"400", "404", "413", "503"} <= set(operation["responses"])


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for item in node for ref in _refs(item)]
    return []


def test_every_reference_resolves_inside_components(client: TestClient) -> None:
    """ReDoc and generated clients stop at `#/$defs/...` (pydantic's inline form): every $ref must point into
    components/schemas, and every one must exist."""
    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    refs = _refs(spec)
    assert refs and "$defs" not in str(spec)
    for ref in refs:
        assert ref.startswith("#/components/schemas/") and ref.removeprefix("#/components/schemas/") in schemas


def test_every_operation_with_input_documents_how_bad_input_is_refused(client: TestClient) -> None:
    """A route that takes parameters or a body answers bad input with 400 or 422: that status must be in the
    document (schemathesis fails on an undocumented status)."""
    spec = client.get("/openapi.json").json()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            queries = [p for p in operation.get("parameters", []) if p["in"] == "query"]
            if operation.get("requestBody") or queries:
                assert {"400", "422"} & set(operation["responses"]), (method, path)
