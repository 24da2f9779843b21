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

from collections.abc import Sequence
from urllib.parse import parse_qsl, urlencode

from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from posenc.service.budget import BodiesInFlight
from posenc.service.http.health import LIVE, LIVENESS_PATH
from posenc.service.http.metrics import scope_header
from posenc.service.tables import TABLES
from posenc.service.tables.answer import Answer, answer_headers, etag_matches, validator_headers
from posenc.service.tables.cache import ByteLRUCache
from posenc.service.tables.http import CACHE_KEY_SCOPE, to_response

MAX_SPELLING = 2048  # characters: the longest request spelling the fast path remembers


def spelling(scope: Scope) -> str | None:
    """The request's cache-relevant spelling, or None when it cannot take the fast path."""
    if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in TABLES:
        return None
    route = TABLES[scope["path"]]
    if route.method != "GET":
        return None
    pairs = sorted(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
    key = scope["path"] + "?" + urlencode(pairs)
    if not any(name == "format" for name, _ in pairs):
        key += "\naccept:" + (scope_header(scope, b"accept") or "")
    return key if len(key) <= MAX_SPELLING else None


class FastPath:
    """ASGI middleware in front of the routes: liveness, and remembered spellings whose table is still cached."""

    def __init__(self, app: ASGIApp, cache: ByteLRUCache, bodies: BodiesInFlight, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.cache = cache
        self.bodies = bodies  # a cached body stays counted in the memory budget while it is sent
        # path → its route, set on the scope as routing would: the metrics and the access log name the template
        self.routes = {route.path: route for route in routes if isinstance(route, APIRoute)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == LIVENESS_PATH and scope["method"] == "GET":
            scope["route"] = self.routes[LIVENESS_PATH]
            await Response(LIVE, media_type="application/json")(scope, receive, send)
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
            answer = Answer(304, validators)
        else:
            release = self.bodies.try_share(cached.body)
            if release is None:  # its bytes must wait for memory: the full path waits (or says 503)
                await self.app(scope, receive, send)
                return
            self.cache.count_hit(cache_key)
            answer = Answer(200, answer_headers(cache_key, cached, "hit"), cached.body, cached.media_type)
            scope["route"] = self.routes[scope["path"]]
            await to_response(answer, release)(scope, receive, send)
            return
        scope["route"] = self.routes[scope["path"]]
        await to_response(answer)(scope, receive, send)
