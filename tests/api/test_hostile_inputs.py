"""Hostile input on every endpoint (query values, bodies, corrupted infer requests): never a 5xx."""

import json
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from posenc.service.testing import RequestedOutput, kserve_request
from tests.conftest import Request, running_client, send_all

HOSTILE = ["", "0", "-1", "1", "2", "3", "nan", "inf", "-inf", "1e308", "99999999999999999999", "abc", "1.5",
           "true", "%00", "\u00e9", "8,8", "-0", " 4", "0x10"]
BODIES = [b"", b"{}", b"[]", b"null", b"\x93NUMPY\x01\x00", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
          b'{"head_dim": 64, "rope_scaling": {"type": "yarn", "factor": 4}}']


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with running_client(max_table_bytes=1 << 22) as c:
        c.raise_server_exceptions = False  # a 5xx must show as a response, not as an exception
        yield c


def operations(client: TestClient) -> list[tuple[str, str, list[dict]]]:
    spec = client.get("/openapi.json").json()
    return [(path, method, [p for p in op.get("parameters", []) if p["in"] == "query"])
            for path, ops in spec["paths"].items() if path.startswith("/v1/") for method, op in ops.items()]


def test_one_hostile_parameter_at_a_time(client: TestClient) -> None:
    requests: list[Request] = []
    for path, method, params in operations(client):
        required = {p["name"]: "4" for p in params if p.get("required")}
        for param in params:
            for value in HOSTILE:
                body = BODIES[len(requests) % len(BODIES)] if method == "post" else None
                requests.append((method.upper(), path, {**required, param["name"]: value}, body, None))
    assert len(requests) > 1000
    for request, r in zip(requests, send_all(client, requests), strict=True):
        assert r.status_code < 500, (request, r.text)
        if r.status_code >= 400:
            assert set(r.json()) == {"error", "type"}, r.text


def test_random_parameter_combinations(client: TestClient) -> None:
    rng = random.Random(0)
    values = ["2", "4", "8", "12", "32", "64", "129", "0", "1", "3", "5", "-1", "0.5", "1.5", "nan", "", "true"]
    requests: list[Request] = []
    for path, method, params in operations(client):
        for _ in range(150):
            query = {}
            for p in params:
                if p["name"] in ("format", "tensor"):
                    continue
                if p.get("required") or rng.random() < 0.5:
                    enum = p["schema"].get("enum")
                    query[p["name"]] = rng.choice(enum) if enum and rng.random() < 0.8 else rng.choice(values)
            requests.append((method.upper(), path, query, rng.choice(BODIES) if method == "post" else None, None))
    for request, r in zip(requests, send_all(client, requests), strict=True):
        assert r.status_code < 500, (request, r.text)


def _binary_infer_body() -> tuple[bytes, int]:
    rng = np.random.default_rng(0)
    arrays = {"query": rng.standard_normal((1, 8, 4, 64), dtype=np.float32),
              "key": rng.standard_normal((1, 8, 4, 64), dtype=np.float32),
              "value": rng.standard_normal((1, 8, 4, 64), dtype=np.float32),
              "position_ids": np.arange(4, dtype=np.int64)[None]}
    request = kserve_request(arrays, outputs=[RequestedOutput("output", binary=True)])
    return request.body, request.header_length or 0


def _mutate(rng: random.Random, body: bytes, header_length: int) -> tuple[bytes, int]:
    """One random corruption: header bytes, truncation, header length, a field's value, or garbage."""
    kind = rng.randrange(5)
    if kind == 0:
        mutated = bytearray(body)
        for _ in range(rng.randrange(1, 4)):
            mutated[rng.randrange(header_length)] = rng.randrange(256)
        return bytes(mutated), header_length
    if kind == 1:
        return body[: rng.randrange(len(body))], header_length
    if kind == 2:
        return body, rng.choice([0, 1, header_length - 1, header_length + 1, len(body), len(body) + 5, -3])
    if kind == 3:
        header = json.loads(body[:header_length])
        entry = rng.choice(header["inputs"] + header["outputs"])
        entry[rng.choice(["shape", "datatype", "name", "parameters", "data"])] = rng.choice(
            [[1, 8, 4, 65], [-1, 8, 4, 64], [1, 8, 4], "FP16", "BYTES", "INT32", "bogus", ["FP32"], {"a": 1},
             {"binary_data_size": -1}, {"binary_data_size": 10**12}, {"binary_data": "yes"}, None,
             [2**40, 8, 4, 64], [0, 8, 0, 64], [[1.0]], 7])
        new_header = json.dumps(header).encode()
        return new_header + body[header_length:], len(new_header)
    return rng.randbytes(rng.randrange(1, 200)), header_length


def test_corrupted_infer_requests_are_4xx(client: TestClient) -> None:
    body, header_length = _binary_infer_body()
    url = "/v2/models/rope_attention/infer"
    assert client.post(url, content=body, headers={"Inference-Header-Content-Length": str(header_length)}).is_success
    rng = random.Random(1)
    requests: list[Request] = []
    for _ in range(1000):
        mutated, length = _mutate(rng, body, header_length)
        requests.append(("POST", url, None, mutated, {"Inference-Header-Content-Length": str(length)}))
    for request, r in zip(requests, send_all(client, requests), strict=True):
        assert r.status_code < 500, (request[3], r.text)


CONFIG = {"hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128, "max_position_embeddings": 8192,
          "rope_theta": 500000.0, "partial_rotary_factor": 1.0, "original_max_position_embeddings": 4096,
          "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192, "beta_fast": 32, "beta_slow": 1, "mscale": 1,
                           "mscale_all_dim": 1, "attention_factor": 1.0, "short_factor": [1.0] * 64,
                           "long_factor": [1.0] * 64, "truncate": True},
          "layer_types": ["full_attention"], "text_config": None}
CONFIG_VALUES = [None, "x", "", 0, -1, 1, 3, 0.5, 1e308, 2**70, True, [], {}, [1, 2], {"a": 1}, "default", "yarn",
                 "longrope", "dynamic", "linear", "proportional", "llama3", "su"]


def test_hostile_config_json_values_are_4xx(client: TestClient) -> None:
    rng = random.Random(2)
    scaling_keys = [*CONFIG["rope_scaling"], "type", "rope_theta", "partial_rotary_factor"]  # type: ignore[misc]
    requests: list[Request] = []
    for _ in range(600):
        config = json.loads(json.dumps(CONFIG))
        for _ in range(rng.randrange(1, 5)):
            if rng.random() < 0.5:
                config[rng.choice(list(CONFIG))] = rng.choice(CONFIG_VALUES)
            elif isinstance(config.get("rope_scaling"), dict):
                config["rope_scaling"][rng.choice(scaling_keys)] = rng.choice(CONFIG_VALUES)
        if rng.random() < 0.2:
            config["rope_parameters"] = config.pop("rope_scaling", None)
        requests.append(("POST", "/v1/rope/from-config", {"max_position": "16"}, json.dumps(config).encode(),
                         {"Content-Type": "application/json"}))
    for request, r in zip(requests, send_all(client, requests), strict=True):
        assert r.status_code < 500, (request[3], r.text)


PATH_VALUES = ["rope_attention", "nope", "..", "%2e%2e", "1", "2", "\u00e9", "a" * 300]


@pytest.mark.parametrize("repository", ["shipped", "empty"])
def test_every_route_answers_errors_in_the_envelope(tmp_path: Path, repository: str) -> None:
    """Every path of the OpenAPI document (operations and /v2 included), with hostile path segments and
    with no models at all: never a 500 (503 only for readiness without models), and every error body
    carries `error` and `type`."""
    overrides = {"model_repository": tmp_path} if repository == "empty" else {}
    with running_client(**overrides) as client:
        client.raise_server_exceptions = False
        requests: list[Request] = [
            (method.upper(), path.replace("{name}", value).replace("{version}", value), None,
             b"{}" if method == "post" else None, None)
            for path, ops in client.get("/openapi.json").json()["paths"].items() for method in ops
            for value in PATH_VALUES]
        allowed = (503,) if repository == "empty" else ()
        for request, r in zip(requests, send_all(client, requests), strict=True):
            assert r.status_code < 500 or r.status_code in allowed, (request[:2], r.text)
            if r.status_code >= 400:
                assert {"error", "type"} <= set(r.json()), (request[:2], r.text)
        for url in ("/readyz", "/v2/health/ready"):
            r = client.get(url)
            if repository == "empty":
                assert r.status_code == 503 and {"error", "type"} <= set(r.json()), r.text
    assert len(requests) > 100
