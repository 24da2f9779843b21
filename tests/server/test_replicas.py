"""Two independently started replicas answer the same request with the same bytes and the same ETag.

A load balancer may send a client's next request to any replica, and a CDN or an nginx cache in front
revalidates with `If-None-Match` against whichever replica it reaches, so nothing process-specific
(hash seeds, start time, pid, cache state) may leak into a body or an ETag. The replicas differ on purpose:
different PYTHONHASHSEED, one with the table cache off; on the other every table is asked for twice (the
second answer comes from the cache, through the fast path).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest

from posenc.service.testing import decode_response, http_request, kserve_request
from tests.golden_requests import ERROR_REQUESTS, GET_REQUESTS, post_requests
from tests.onnx_models import random_inputs
from tests.server.test_shutdown import running_server

Answer = tuple[int, str | None, str | None, bytes]  # status, ETag, Content-Type, body
Request = tuple[str, str, bytes, dict[str, str]]  # method, path and query, body, headers


def call(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Answer:
    status, answer_headers, answer = http_request(port, path, method, body or None, headers)
    return status, answer_headers.get("etag"), answer_headers.get("content-type"), answer


@pytest.fixture(scope="module")
def replicas() -> Iterator[tuple[int, int]]:
    with mock.patch.dict(os.environ, {"PYTHONHASHSEED": "1"}), running_server(cache_bytes=0) as (_, first), \
            mock.patch.dict(os.environ, {"PYTHONHASHSEED": "2"}), running_server() as (_, second):
        yield first, second


def table_requests() -> list[Request]:
    """The pinned golden requests (every family, every wire format, errors, POST bodies), and one by Accept."""
    gets: list[Request] = [("GET", url, b"", {}) for url in GET_REQUESTS + ERROR_REQUESTS]
    gets.append(("GET", "/v1/sinusoidal?max_position=8&dim=16", b"", {"Accept": "application/x-npy"}))
    posts = [("POST", url, body, {"Content-Type": ctype}) for url, body, ctype in post_requests()]
    return gets + posts


@pytest.mark.timeout(300)
def test_tables_are_byte_identical_with_the_same_etag(replicas: tuple[int, int]) -> None:
    first, second = replicas
    requests = table_requests()
    assert {url.split("?")[0] for _, url, _, _ in requests} >= {
        "/v1/rope", "/v1/rope/from-config", "/v1/sinusoidal", "/v1/alibi/slopes", "/v1/alibi/bias",
        "/v1/t5/buckets", "/v1/t5/bias", "/v1/deberta/buckets", "/v1/relative/clipped"}
    formats = {url.split("format=")[1].split("&")[0] for _, url, _, _ in requests if "format=" in url}
    assert formats >= {"npy", "raw", "json"}
    for method, url, body, headers in requests:
        uncached = call(first, method, url, body, headers)
        computed = call(second, method, url, body, headers)
        cached = call(second, method, url, body, headers)
        assert uncached == computed == cached, f"{method} {url}: the replicas disagree"
        status, etag, _, _ = uncached
        if status == 200:
            assert etag and etag.startswith('"'), f"{method} {url}: no strong ETag"
            # Either replica revalidates the other's ETag (a GET: a POST that matches gets 412, RFC 9110).
            revalidated = call(first, method, url, body, {**headers, "If-None-Match": etag})[0]
            assert revalidated == (304 if method == "GET" else 412)


def infer_body(hq: int, hkv: int, head_dim: int) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 request with binary inputs and a binary output: its body and headers."""
    request = kserve_request(random_inputs(hq, hkv, head_dim, batch=2, seq=5, seed=7), request_id="replica-check",
                             binary_output=True, content_type=True)
    return request.body, request.headers


def infer(port: int, model: str, body: bytes, headers: dict[str, str]) -> tuple[dict[str, object], bytes]:
    """The JSON header and the raw output bytes of one binary KServe v2 inference."""
    status, answer_headers, answer = http_request(port, f"/v2/models/{model}/infer", "POST", body, headers)
    assert status == 200, answer[:500]
    response = decode_response(answer, answer_headers)
    return response.header, response.outputs["output"].tobytes()


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("model", "hq", "hkv", "head_dim"),
                         [("rope_attention", 8, 8, 64), ("llama3_1_attention", 32, 8, 128)])
def test_inference_outputs_are_identical(replicas: tuple[int, int], model: str, hq: int, hkv: int,
                                         head_dim: int) -> None:
    body, headers = infer_body(hq, hkv, head_dim)
    (header_a, output_a), (header_b, output_b) = (infer(port, model, body, headers) for port in replicas)
    assert header_a == header_b
    assert output_a == output_b
    values = np.frombuffer(output_a, dtype=np.float32)
    assert values.size == 2 * hq * 5 * head_dim and np.isfinite(values).all() and np.abs(values).max() > 0
