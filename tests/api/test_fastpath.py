"""The cache-hit fast path answers exactly what the full path answers, shares entries across spellings,
and never serves a request that the full path would refuse."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from posenc.service.tables.answer import TableRequest
from tests.conftest import running_client

TABLE_REQUESTS = [
    "/v1/rope?max_position=8&head_dim=16",
    "/v1/rope?max_position=8&head_dim=16&rope_type=linear&factor=2",
    "/v1/sinusoidal?max_position=8&dim=6&variant=fairseq",
    "/v1/alibi/slopes?num_heads=12",
    "/v1/alibi/bias?num_heads=3&query_length=2&key_length=5&mask=true",
    "/v1/t5/buckets?query_length=4&key_length=9",
    "/v1/deberta/buckets?query_length=4&key_length=9",
    "/v1/relative/clipped?query_length=4&key_length=9&max_relative_position=2",
]
FORMATS = ["safetensors", "json", "npy", "raw"]


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Records every request that took the full path (parameter validation and `TableRequest.prepare`)."""
    calls: list[str] = []
    original = TableRequest.prepare

    def recording(self: TableRequest, query: object) -> object:
        calls.append(type(query).__name__)
        return original(self, query)  # type: ignore[arg-type]

    monkeypatch.setattr(TableRequest, "prepare", recording)
    yield calls


def _single(url: str, fmt: str) -> str:
    tensor = "&tensor=cos" if url.startswith("/v1/rope") and fmt in ("npy", "raw") else ""
    return f"{url}&format={fmt}{tensor}"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("url", TABLE_REQUESTS)
def test_fast_path_answers_byte_for_byte_what_the_full_path_answers(prepared: list[str], url: str, fmt: str) -> None:
    with running_client() as client:
        miss = client.get(_single(url, fmt))
        assert miss.status_code == 200 and miss.headers["X-Cache"] == "miss"
        # the same table under another spelling (a parameter the table ignores): the full path, from the cache
        full_hit = client.get(_single(url, fmt) + "&unused=1")
        assert len(prepared) == 2
        fast_hit = client.get(_single(url, fmt))
        assert len(prepared) == 2, "the second request of a spelling must not take the full path"
    assert full_hit.headers["X-Cache"] == fast_hit.headers["X-Cache"] == "hit"
    assert fast_hit.content == full_hit.content == miss.content
    assert dict(fast_hit.headers) == dict(full_hit.headers)


def test_conditional_requests_on_the_fast_path(prepared: list[str]) -> None:
    with running_client() as client:
        url = TABLE_REQUESTS[0]
        etag = client.get(url).headers["ETag"]
        full = client.get(url + "&offset=0", headers={"If-None-Match": etag})  # a new spelling: full path
        fast = client.get(url, headers={"If-None-Match": etag})
        other = client.get(url, headers={"If-None-Match": '"something-else"'})
    assert len(prepared) == 2
    assert full.status_code == fast.status_code == 304 and fast.content == b""
    assert dict(full.headers) == dict(fast.headers)
    assert other.status_code == 200


def test_equivalent_spellings_share_one_cache_entry() -> None:
    with running_client() as client:
        cache = client.app.state.process.table_cache  # type: ignore[attr-defined]
        spellings = ["/v1/alibi/slopes?num_heads=12", "/v1/alibi/slopes?num_heads=12&alibi_bias_max=8",
                     "/v1/alibi/slopes?alibi_bias_max=8.0&num_heads=12&dtype=float32",
                     "/v1/alibi/slopes?num_heads=012&alibi_bias_max=0.8e1"]
        bodies = {client.get(url).content for url in spellings for _ in range(2)}
        assert len(bodies) == 1 and len(cache) == 1


def test_accept_decides_the_format_on_the_fast_path() -> None:
    with running_client() as client:
        url = TABLE_REQUESTS[3]
        for _ in range(2):
            as_json = client.get(url, headers={"Accept": "application/json"})
            as_npy = client.get(url, headers={"Accept": "application/x-npy"})
            assert as_json.headers["content-type"] == "application/json"
            assert as_npy.headers["content-type"] == "application/x-npy"


@pytest.mark.parametrize("bad", ["/v1/alibi/slopes?num_heads=12&format=xml",
                                 "/v1/alibi/slopes?num_heads=0",
                                 "/v1/rope?max_position=8&head_dim=16&format=npy",
                                 "/v1/rope?max_position=8&head_dim=16&format=npy&tensor=tan"])
def test_a_refused_request_is_refused_every_time(bad: str) -> None:
    with running_client() as client:
        good = bad.replace("&format=xml", "").replace("num_heads=0", "num_heads=12").split("&format=npy")[0]
        assert client.get(good).status_code == 200
        statuses = {client.get(bad).status_code for _ in range(3)}
        assert len(statuses) == 1 and statuses.pop() >= 400


def test_an_evicted_table_takes_the_full_path_again(prepared: list[str]) -> None:
    with running_client(cache_bytes=2500) as client:  # room for one small table (about 1.6 kB with its spelling)
        first, second = TABLE_REQUESTS[3], "/v1/alibi/slopes?num_heads=13"
        client.get(first)
        client.get(second)  # evicts the first
        again = client.get(first)
    assert again.status_code == 200 and again.headers["X-Cache"] == "miss" and len(prepared) == 3


def test_fast_path_requests_are_counted_under_their_route(client: TestClient) -> None:
    start = time.perf_counter()
    for _ in range(3):
        client.get(TABLE_REQUESTS[3])
    wall = time.perf_counter() - start
    metrics = client.get("/metrics").text
    assert 'posenc_http_requests_total{method="GET",route="/v1/alibi/slopes",status="200"} 3.0' in metrics
    assert "posenc_table_cache_hits_total 2.0" in metrics
    timed = re.search(r'^posenc_http_request_duration_seconds_sum\{method="GET",route="/v1/alibi/slopes"\} (\S+)',
                      metrics, re.M)
    assert timed is not None and 0 < float(timed.group(1)) <= wall  # the miss and the two hits, each timed


def test_liveness_is_answered_before_routing_and_counted(client: TestClient) -> None:
    from posenc.service import __version__

    for _ in range(2):
        r = client.get("/healthz")
        assert r.status_code == 200 and r.json() == {"status": "ok", "version": __version__}
        assert r.headers["content-type"] == "application/json"
    assert 'posenc_http_requests_total{method="GET",route="/healthz",status="200"} 2.0' in client.get("/metrics").text


QUERIES = ["", "a=1", "num_heads=12", "num_heads=12&dtype=float32", "dtype=float32&num_heads=12", "b=2&a=1&a=0",
           "format=json&a=1", "a=&b=", "x=1.5e3&x=-2&x=~_.-", "a.b=1&a-b=2&a_b=3&a~b=4&A=5",
           # not plain: decoded and re-quoted
           "a=1+2", "a=%41&b=%7E", "a", "a=1&&b=2", "=1", "a=b=c", "a=1;b=2", "c=%E2%82%AC&a=,", "format%3D=1",
           "a=1&format", "FORMAT=json", "formats=x"]


@pytest.mark.parametrize("query", QUERIES)
def test_canonical_query_is_the_sorted_urlencoded_pairs(query: str) -> None:
    from urllib.parse import parse_qsl, urlencode

    from posenc.service.http.fastpath import canonical_query

    pairs = sorted(parse_qsl(query, keep_blank_values=True))
    assert canonical_query(query) == (urlencode(pairs), any(name == "format" for name, _ in pairs))


@pytest.mark.parametrize("fmt", [*FORMATS, "png"])
def test_cached_hits_send_the_headers_a_response_would(fmt: str) -> None:
    """The fast path writes its ASGI messages itself: the same raw headers, in the same order, as the full
    path's starlette Response."""
    from posenc.service.http.fastpath import hit_headers
    from posenc.service.tables.answer import Answer, answer_headers
    from posenc.service.tables.routes import to_response

    with running_client() as client:
        url = _single(TABLE_REQUESTS[3], fmt)
        client.get(url)
        cache = client.app.state.process.table_cache  # type: ignore[attr-defined]
        ((key, slot),) = cache._slots.items()  # the one entry
    cached = slot.entry
    response = to_response(Answer(200, answer_headers(key, cached, "hit"), cached.body, cached.media_type))
    assert hit_headers(key, cached) == response.raw_headers


def test_hits_are_answered_outside_the_middleware_stack(caplog: pytest.LogCaptureFixture) -> None:
    """A hit and liveness pass through none of the application's layers (FastAPI's error, telemetry and body-limit
    middleware, observability, restricted groups, a middleware added by a user), yet are counted and logged."""
    from starlette.types import ASGIApp, Receive, Scope, Send

    from posenc.service.http.app import create_app
    from posenc.service.settings import Settings

    reached: list[str] = []

    class Layer:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                reached.append(scope["path"])
            await self.app(scope, receive, send)

    app = create_app(Settings(access_log=True))
    app.add_middleware(Layer)
    url = TABLE_REQUESTS[3]
    with caplog.at_level("INFO", logger="posenc.access"), TestClient(app) as client:
        answers = [client.get(url) for _ in range(3)] + [client.get("/healthz")]
        metrics = client.get("/metrics").text
    assert [a.status_code for a in answers] == [200] * 4
    assert [a.headers["X-Cache"] for a in answers[:3]] == ["miss", "hit", "hit"]
    assert reached == ["/v1/alibi/slopes", "/metrics"]  # the miss, and /metrics (not a table)
    assert 'posenc_http_requests_total{method="GET",route="/v1/alibi/slopes",status="200"} 3.0' in metrics
    logged = [(r.access["route"], r.access["status"]) for r in caplog.records if hasattr(r, "access")]  # type: ignore[attr-defined]
    assert logged[:4] == [("/v1/alibi/slopes", 200)] * 3 + [("/healthz", 200)]


def test_the_hit_headers_are_made_once_per_cache_entry() -> None:
    with running_client() as client:
        client.get(TABLE_REQUESTS[3])
        ((key, slot),) = client.app.state.process.table_cache._slots.items()  # type: ignore[attr-defined]
        fast_path = client.app.fast_path  # type: ignore[attr-defined]
    made = fast_path._hit_headers(key, slot.entry)
    assert fast_path._hit_headers(key, slot.entry) is made
    again = dataclasses.replace(slot.entry)  # the entry computed again after an eviction: its headers made anew
    assert fast_path._hit_headers(key, again) is not made


@pytest.mark.parametrize(("extra", "remembered"), [(0, True), (1, False)])
def test_spellings_up_to_the_bound_are_remembered(extra: int, remembered: bool) -> None:
    from posenc.service.http.fastpath import MAX_SPELLING, spelling

    path = "/v1/alibi/slopes"
    head = f"{path}?format=json&num_heads=8&pad="
    query = head[len(path) + 1:] + "a" * (MAX_SPELLING - len(head) + extra)
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query.encode(), "headers": []}
    assert (spelling(scope) is not None) == remembered


def test_the_hit_headers_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import posenc.service.http.fastpath

    monkeypatch.setattr(posenc.service.http.fastpath, "MAX_HIT_HEADERS", 2)
    with running_client() as client:
        for heads in range(1, 6):
            url = f"/v1/alibi/slopes?num_heads={heads}"
            assert [client.get(url).headers["X-Cache"] for _ in range(2)] == ["miss", "hit"]
            assert len(client.app.fast_path.hit_headers) <= 2  # type: ignore[attr-defined]
