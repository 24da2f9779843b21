"""The fast path: answers that need no routing. Liveness (`GET /healthz`, polled constantly by probes
and load balancers) is a constant; a table request seen before is answered from the cache without
parameter validation, worker threads or recomputation.

A table route that answers 200 or 304 remembers its request's *spelling* — path, query pairs in a
canonical order, and the Accept header when no `format=` is given — next to the canonical cache key
the full path computed. Every spelling of one table (parameter order, defaults written out or
omitted, `0.50` vs `0.5`) maps to the same cache entry, because the full path resolved it the first
time. Spellings live with their cache entry and are charged to the cache budget
(`ByteLRUCache.remember_spelling`); a spelling longer than `MAX_SPELLING` (a long query, a 1 MiB Accept
header) is never stored: such a request takes the full path every time. Only answers are remembered,
never errors, so a request that would be refused always takes the full path; an entry evicted from the
cache, or a spelling not seen yet, does too.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import parse_qsl, urlencode

from fastapi.routing import APIRoute
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from posenc.service.budget import BodiesInFlight
from posenc.service.http.health import LIVE, LIVENESS_PATH
from posenc.service.http.metrics import RequestRecorder, scope_header
from posenc.service.request_kit.sending import send_held
from posenc.service.tables import TABLES
from posenc.service.tables.answer import answer_headers, etag_matches, validator_headers
from posenc.service.tables.cache import ByteLRUCache, CachedBody
from posenc.service.tables.routes import CACHE_KEY_SCOPE

MAX_SPELLING = 2048  # characters: the longest request spelling the fast path remembers
MAX_HIT_HEADERS = 4096  # cache entries whose raw hit headers are kept made (a few hundred bytes each)
LIVE_HEADERS = [(b"content-length", b"%d" % len(LIVE)), (b"content-type", b"application/json")]
# name=value pairs of characters that neither parse_qsl decodes nor urlencode quotes: such a query is its own
# canonical spelling once its pairs are in order
_PLAIN = "[A-Za-z0-9_.~-]"
_PLAIN_QUERY = re.compile(f"{_PLAIN}+={_PLAIN}*(?:&{_PLAIN}+={_PLAIN}*)*")


def canonical_query(query: str) -> tuple[str, bool]:
    """`urlencode(sorted(parse_qsl(query, keep_blank_values=True)))`, and whether a `format` parameter is
    among the pairs; a plain query (the usual one) is sorted as written, without decoding and re-quoting."""
    if _PLAIN_QUERY.fullmatch(query):
        pairs = sorted(query.split("&"), key=lambda pair: pair.split("=", 1))  # as the (name, value) tuples sort
        return "&".join(pairs), any(pair.startswith("format=") for pair in pairs)
    decoded = sorted(parse_qsl(query, keep_blank_values=True))
    return urlencode(decoded), any(name == "format" for name, _ in decoded)


def spelling(scope: Scope) -> str | None:
    """The request's cache-relevant spelling, or None when it cannot take the fast path."""
    if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in TABLES:
        return None
    route = TABLES[scope["path"]]
    if route.method != "GET":
        return None
    query, has_format = canonical_query(scope["query_string"].decode("latin-1"))
    key = scope["path"] + "?" + query
    if not has_format:
        key += "\naccept:" + (scope_header(scope, b"accept") or "")
    return key if len(key) <= MAX_SPELLING else None


def hit_headers(cache_key: str, cached: CachedBody) -> list[tuple[bytes, bytes]]:
    """The raw headers of a 200 from the cache, as `to_response` would send them: the answer's headers, then
    Content-Length and Content-Type (table media types are not text/*: no charset is added)."""
    raw = _raw(answer_headers(cache_key, cached, "hit"))
    raw.append((b"content-length", b"%d" % len(cached.body)))
    raw.append((b"content-type", cached.media_type.encode("latin-1")))
    return raw


class FastPath:
    """In front of the application (`posenc.service.http.app.PosencApp`): liveness, and remembered spellings
    whose table is still cached, answered and recorded (`RequestRecorder`) before FastAPI sees them; everything
    else goes to `app`, FastAPI itself."""

    def __init__(self, app: ASGIApp, cache: ByteLRUCache, bodies: BodiesInFlight, routes: Sequence[BaseRoute],
                 recorder: RequestRecorder) -> None:
        self.app = app
        self.cache = cache
        self.bodies = bodies  # a cached body stays counted in the memory budget while it is sent
        self.recorder = recorder
        # path → its route, set on the scope as routing would: the metrics and the access log name the template
        self.routes = {route.path: route for route in routes if isinstance(route, APIRoute)}
        # the raw headers of a hit, made once per cache entry: cache key → (the entry, its headers)
        self.hit_headers: dict[str, tuple[CachedBody, list[tuple[bytes, bytes]]]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        if scope["path"] == LIVENESS_PATH:
            scope["route"] = self.routes[LIVENESS_PATH]
            await self._answer(scope, send, start, 200, LIVE_HEADERS, LIVE, None)
            return
        spelled = spelling(scope)
        if spelled is None:
            await self.app(scope, receive, send)
            return
        cache_key = self.cache.spelling(spelled)
        cached = self.cache.peek(cache_key) if cache_key is not None else None
        if cache_key is None or cached is None:
            await self.app(scope, receive, send)
            learned = scope.get(CACHE_KEY_SCOPE)
            if learned is not None:
                self.cache.remember_spelling(spelled, learned)
            return
        validators = validator_headers(cache_key)
        if etag_matches(scope_header(scope, b"if-none-match"), validators["ETag"]):
            scope["route"] = self.routes[scope["path"]]
            await self._answer(scope, send, start, 304, _raw(validators), b"", None)
            return
        release = self.bodies.try_share(cached.body)
        if release is None:  # its bytes must wait for memory: the full path waits (or says 503)
            await self.app(scope, receive, send)
            return
        scope["route"] = self.routes[scope["path"]]
        self.cache.count_hit(cache_key)
        await self._answer(scope, send, start, 200, self._hit_headers(cache_key, cached), cached.body, release)

    def _hit_headers(self, cache_key: str, cached: CachedBody) -> list[tuple[bytes, bytes]]:
        made = self.hit_headers.get(cache_key)
        if made is not None and made[0] is cached:
            return made[1]
        if len(self.hit_headers) >= MAX_HIT_HEADERS:
            self.hit_headers.clear()  # entries of tables evicted since: made again when asked for
        headers = hit_headers(cache_key, cached)
        self.hit_headers[cache_key] = (cached, headers)
        return headers

    async def _answer(self, scope: Scope, send: Send, start: float, status: int, headers: list[tuple[bytes, bytes]],
                      body: bytes, release: Callable[[], None] | None) -> None:
        """The two ASGI messages themselves (what starlette's Response would send, without building one),
        recorded as `ObservabilityMiddleware` records the requests that take the full path."""
        in_flight = self.recorder.metrics.in_flight
        in_flight.inc()
        try:
            if release is None:
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": body})
            else:
                await send_held(scope, send, status, headers, body, release)
        finally:
            in_flight.dec()
            self.recorder.record(scope, status, len(body), time.perf_counter() - start)


def _raw(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
