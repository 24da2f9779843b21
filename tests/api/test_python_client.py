"""posenc.client against the app in-process: every registered family by name, bodies of the POST families,
ETag reuse, the error taxonomy mirrored class by class, parameters checked against the registry, and the async
client on the same transport. The shared client fixtures against a live server: tests/server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx2
import numpy as np
import pytest
from fastapi.testclient import TestClient

import posenc
from posenc.client import (
    ERRORS,
    AsyncClient,
    Client,
    InvalidParameterError,
    InvalidResponseError,
    PayloadTooLargeError,
    PosencError,
    Table,
    UnavailableError,
    families,
)
from posenc.models.rope import make_rope_parameters, rope_cos_sin
from posenc.service import errors
from posenc.service.client import error_from_answer, method_name
from posenc.service.tables.registry import TABLES, table_routes
from tests.conftest import running_client


@pytest.fixture(scope="module")
def app_client() -> Iterator[TestClient]:
    with running_client(max_table_bytes=1 << 20) as client:
        yield client


@pytest.fixture
def statuses(app_client: TestClient) -> Iterator[list[int]]:
    """The status of every answer the app gives through `app_client` during the test."""
    seen: list[int] = []
    app_client.event_hooks["response"].append(lambda response: seen.append(response.status_code))
    yield seen
    app_client.event_hooks["response"].clear()


@pytest.fixture
def client(app_client: TestClient) -> Client:
    return Client(http=app_client)


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_subclasses(direct)}}


def test_every_service_error_has_its_client_exception() -> None:
    service = {cls for cls in _subclasses(errors.ServiceError) if cls.__module__ == errors.__name__}
    assert {cls.service_error for cls in ERRORS} == service
    assert len({cls.service_error.error_type for cls in ERRORS}) == len(ERRORS)
    for cls in ERRORS:
        status, code = cls.service_error.status_code, cls.service_error.error_type
        raised = error_from_answer(status, b'{"error": "what went wrong", "type": "%s"}' % code.encode(), {})
        assert (type(raised), raised.status, raised.error, raised.type) == (cls, status, "what went wrong", code)


def test_an_error_body_that_is_not_the_envelope() -> None:
    raised = error_from_answer(502, b"<html>Bad Gateway</html>", {})
    assert type(raised) is PosencError and raised.type is None and "Bad Gateway" in raised.error


def test_every_registered_family_is_a_method() -> None:
    assert set(families()) == {method_name(path) for path in table_routes()}
    assert {"rope", "alibi_bias", "rope_from_config", "t5_bias", "properties_rope"} <= set(families())
    assert set(families()) <= set(dir(Client()))
    with pytest.raises(AttributeError, match=r"table families: .*alibi_slopes"):
        _ = Client().no_such_family


def test_no_table_parameter_is_named_like_a_client_keyword() -> None:
    for route in table_routes().values():
        assert "body" not in route.query.model_fields, route.path


@pytest.mark.parametrize(("dtype", "numpy"), [("float32", np.float32), ("float64", np.float64),
                                              ("float16", np.float16), ("bfloat16", "bfloat16")])
def test_tables_come_as_numpy_arrays(client: Client, dtype: str, numpy: object) -> None:
    rope = client.rope(max_position=5, head_dim=8, dtype=dtype)
    assert isinstance(rope, Table) and list(rope) == ["cos", "sin", "inv_freq"]
    assert rope["cos"].dtype == np.dtype(numpy) and rope["cos"].shape == (5, 8)  # type: ignore[call-overload]
    cos, _, _ = rope_cos_sin(make_rope_parameters(head_dim=8), 5)
    np.testing.assert_allclose(rope["cos"].astype(np.float64), cos, atol=1e-2 if dtype == "bfloat16" else 1e-3)
    assert rope.metadata["dtype"] == dtype and rope.etag
    assert not rope["cos"].flags.writeable


def test_parameters_are_checked_against_the_registry(client: Client) -> None:
    with pytest.raises(TypeError, match="no parameter max_positon; its parameters: preset, max_position, dim"):
        client.sinusoidal(max_positon=4, dim=8)
    with pytest.raises(ValueError, match="not a table endpoint"):
        client.table("/v1/nothing", a=1)
    with pytest.raises(TypeError, match="takes a body"):
        client.t5_bias(query_length=2, key_length=2)


def test_the_post_families_take_their_bodies(client: Client) -> None:
    weight = np.arange(32 * 2, dtype=np.float32).reshape(32, 2)
    bias = client.t5_bias(body=weight, query_length=3, key_length=4)
    assert bias["bias"].shape == (2, 3, 4)
    assert np.array_equal(client.t5_bias(body={"weight": weight}, query_length=3, key_length=4)["bias"], bias["bias"])
    config = {"rope_theta": 10000.0, "head_dim": 8, "hidden_size": 16, "num_attention_heads": 2,
              "max_position_embeddings": 6}
    assert np.array_equal(client.rope_from_config(body=config)["cos"], client.rope(max_position=6, head_dim=8)["cos"])
    mrope = client.rope_mrope(body={"segments": [{"type": "text", "length": 5}]}, head_dim=8, mrope_section=[1, 1, 2])
    assert mrope["cos"].shape[-2:] == (5, 8)


def test_an_unchanged_table_is_answered_from_the_clients_cache(client: Client, statuses: list[int]) -> None:
    first = client.alibi_bias(num_heads=2, query_length=3, key_length=4, mask=True)
    again = client.alibi_bias(num_heads=2, query_length=3, key_length=4, mask=True)
    assert statuses == [200, 304] and again is first
    assert np.isneginf(first["bias"]).any()
    client.alibi_bias(num_heads=2, query_length=3, key_length=5)
    assert statuses == [200, 304, 200]


def test_a_304_answers_with_the_table_its_request_named(client: Client) -> None:
    first = client.alibi_slopes(num_heads=4)
    answers = client._answers
    request = answers.table_request("/v1/alibi/slopes", None, {"num_heads": 4})
    assert request.headers["If-None-Match"] == first.etag
    answers._cache.clear()  # dropped in the meantime (by another answer of the async client)
    assert answers.table_answer(request, 304, b"", {}) is first


def test_the_cache_is_bounded(app_client: TestClient, statuses: list[int]) -> None:
    client = Client(http=app_client, cache_bytes=100)
    client.alibi_slopes(num_heads=4)  # 16 bytes: kept
    client.sinusoidal(max_position=8, dim=8)  # 256 bytes: over the bound, not kept
    client.alibi_slopes(num_heads=4)
    client.sinusoidal(max_position=8, dim=8)
    assert statuses == [200, 200, 304, 200]
    assert Client(http=app_client, cache_bytes=0).alibi_slopes(num_heads=4).etag


def test_the_cache_drops_the_table_used_longest_ago(app_client: TestClient, statuses: list[int]) -> None:
    client = Client(http=app_client, cache_bytes=32)  # two slopes tables of 4 heads (16 bytes each)
    a, b, c = ({"num_heads": 4, "alibi_bias_max": m} for m in (8, 16, 32))
    assert client.alibi_slopes(**a).nbytes == 16
    client.alibi_slopes(**b)
    client.alibi_slopes(**c)  # a is dropped: the oldest
    assert statuses == [200, 200, 200]
    client.alibi_slopes(**c)
    client.alibi_slopes(**b)  # b is now the newest, c the oldest
    assert statuses[3:] == [304, 304]
    client.alibi_slopes(**a)  # kept again, c dropped
    client.alibi_slopes(**b)
    client.alibi_slopes(**c)
    assert statuses[5:] == [200, 304, 200]


def test_errors_are_typed(client: Client) -> None:
    with pytest.raises(InvalidParameterError) as info:
        client.alibi_bias(num_heads=2, query_length=3, key_length=4, mode="sideways")
    assert (info.value.status, info.value.type) == (422, "invalid_parameter") and "mode" in info.value.error
    with pytest.raises(PayloadTooLargeError, match="1048576"):
        client.rope(max_position=4096, head_dim=128)


def test_check_my_port(client: Client) -> None:
    golden = client.rope(max_position=32, head_dim=16)
    same = client.check("/v1/rope", {"cos": golden["cos"], "sin": golden["sin"]}, max_position=32, head_dim=16)
    assert same["verdict"] == "matches" and same["likely_cause"] is None
    pairs = client.rope(max_position=32, head_dim=16, layout="interleaved")
    report = client.check("/v1/rope", {"cos": pairs["cos"]}, max_position=32, head_dim=16)
    assert (report["verdict"], report["likely_cause"]) == ("mismatch", "layout")
    with pytest.raises(InvalidParameterError, match=r"\[4, 4\]"):
        client.check("/v1/sinusoidal", {"pe": np.zeros((2, 4), np.float32)}, max_position=4, dim=4)
    with pytest.raises(ValueError, match="has no check"):
        client.check("/v1/properties/rope", {"distance": np.zeros(3)})
    with pytest.raises(ValueError, match="give at least one tensor"):
        client.check("/v1/rope", {}, max_position=32, head_dim=16)


def test_an_answer_that_is_no_table(app_client: TestClient) -> None:
    def not_safetensors(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=b"<html></html>")

    with (httpx2.Client(transport=httpx2.MockTransport(not_safetensors), base_url="http://x") as http,
          pytest.raises(InvalidResponseError, match="not a table")):
        Client(http=http).alibi_slopes(num_heads=4)


def test_an_answer_that_is_no_json(app_client: TestClient) -> None:
    def html(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=b"<html></html>")

    with (httpx2.Client(transport=httpx2.MockTransport(html), base_url="http://x") as http,
          pytest.raises(InvalidResponseError, match="not JSON")):
        Client(http=http).check("/v1/rope", {"cos": np.ones((4, 8), np.float32)}, max_position=4, head_dim=8)


def test_a_changed_table_replaces_the_cached_one(app_client: TestClient) -> None:
    """A 200 to a conditional request (the table changed: another server version behind the same address) is
    the new table, never the one kept."""
    tables = iter([app_client.get("/v1/alibi/slopes?num_heads=4"), app_client.get("/v1/alibi/slopes?num_heads=8")])

    def answer(request: httpx2.Request) -> httpx2.Response:
        served = next(tables)
        return httpx2.Response(served.status_code, content=served.content, headers=served.headers)

    with httpx2.Client(transport=httpx2.MockTransport(answer), base_url="http://x") as http:
        client = Client(http=http)
        first = client.alibi_slopes(num_heads=4)
        second = client.alibi_slopes(num_heads=4)
    assert first["slopes"].shape == (4,) and second["slopes"].shape == (8,) and second.etag != first.etag


def test_a_table_of_the_whole_cache_size_is_kept(app_client: TestClient, statuses: list[int]) -> None:
    client = Client(http=app_client, cache_bytes=16)  # the 4 slopes, float32
    client.alibi_slopes(num_heads=4)
    client.alibi_slopes(num_heads=4)
    assert statuses == [200, 304]


@pytest.mark.parametrize(("headers", "retry_after"), [({}, None), ({"retry-after": "3"}, 3),
                                                      ({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}, None)])
def test_retry_after_is_read_when_it_is_seconds(headers: dict[str, str], retry_after: int | None) -> None:
    error = error_from_answer(503, b'{"type": "unavailable", "error": "busy"}', headers)
    assert isinstance(error, UnavailableError) and error.retry_after == retry_after


def test_the_clients_own_headers_are_their_http_clients_defaults() -> None:
    headers = {"X-Key": "secret"}
    with Client("http://x", headers=headers) as client:
        assert client.http.headers["X-Key"] == "secret"

    async def in_async() -> str:
        async with AsyncClient("http://x", headers=headers) as client:
            return client.http.headers["X-Key"]

    assert asyncio.run(in_async()) == "secret"


def test_the_async_client_in_process(app_client: TestClient) -> None:
    async def main() -> tuple[Table, Table, list[int]]:
        seen: list[int] = []

        async def record(response: httpx2.Response) -> None:
            seen.append(response.status_code)

        transport = httpx2.ASGITransport(app=app_client.app)  # type: ignore[arg-type]
        async with httpx2.AsyncClient(transport=transport, base_url="http://posenc",
                                      event_hooks={"response": [record]}) as http, AsyncClient(http=http) as client:
            first = await client.rope(max_position=4, head_dim=8)
            again = await client.table("/v1/rope", max_position=4, head_dim=8)
            report = await client.check("/v1/rope", dict(first), max_position=4, head_dim=8)
            assert report["verdict"] == "matches"
            with pytest.raises(InvalidParameterError, match="num_buckets"):
                await client.t5_buckets(query_length=2, key_length=2, num_buckets=0)
            return first, again, seen

    first, again, seen = asyncio.run(main())
    assert again is first and seen[:2] == [200, 304]


def test_posenc_table_is_the_app_answered_in_process() -> None:
    table = posenc.table("/v1/deberta/buckets", query_length=3, key_length=5)
    assert table["relative_positions"].dtype == np.int64 and table["relative_positions"].shape == (3, 5)
    assert set(TABLES) <= set(table_routes())
