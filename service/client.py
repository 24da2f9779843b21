"""A thin Python client of posenc: tables as numpy arrays, check-my-port, typed errors; sync and async.

    from posenc.client import Client
    with Client("http://127.0.0.1:8000") as client:
        rope = client.rope(max_position=4096, head_dim=128)   # = client.table("/v1/rope", max_position=..., ...)
        rope["cos"]        # np.ndarray [4096, 128] float32 (bfloat16 tables: ml_dtypes.bfloat16)
        rope.metadata      # the resolved parameters and the service version (safetensors __metadata__)
        report = client.check("/v1/rope", {"cos": my_cos, "sin": my_sin}, max_position=4096, head_dim=128)

Every table family the service registers is a method named after its path (`/v1/alibi/bias` → `alibi_bias`,
`/v1/rope/from-config` → `rope_from_config`, `/v1/properties/rope` → `properties_rope`): the names, and the
parameters each takes, come from the registry (`posenc.service.tables.registry`), so a misspelt parameter is a
TypeError naming the allowed ones instead of a parameter the service would ignore. Tables come as safetensors;
GET answers are kept (bounded by `cache_bytes`) with their ETag and asked again with If-None-Match, so a 304
is answered from this cache. An error answer raises the `PosencError` subclass of its `type` (the taxonomy of
`posenc.service.errors`), carrying the service's `error` message and `type`.

`http=` takes any httpx2 client, e.g. FastAPI's TestClient for the app in-process (`posenc.table` does so).
Needs httpx2: the `client` extra (`pip install 'posenc[client]'`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

import posenc.service.properties  # noqa: F401  (registers the properties endpoints beside the tables)
from posenc.service import errors
from posenc.service.codec.decode import decode_safetensors_bundle
from posenc.service.codec.encode import MEDIA_TYPES, encode_npy, encode_safetensors
from posenc.service.tables.registry import TABLES, TableRoute, table_routes

if TYPE_CHECKING:
    import httpx2

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_CACHE_BYTES = 64 << 20
ERROR_TEXT_LIMIT = 500  # characters of an error body that is not the service's JSON envelope


def _httpx2() -> Any:
    try:
        import httpx2
    except ImportError:
        raise ImportError("posenc.client needs httpx2: pip install 'posenc[client]'") from None
    return httpx2


# ------------------------------------------------------------------------------------------------ errors


class PosencError(Exception):
    """An error answer of the service: HTTP `status`, its `error` message and `type` code (None: the body was
    not the service's `{"error", "type"}` envelope, e.g. a proxy's page), and the response headers."""

    service_error: type[errors.ServiceError] = errors.ServiceError

    def __init__(self, status: int, error: str, error_type: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status} {error_type or 'error'}: {error}")
        self.status, self.error, self.type, self.headers = status, error, error_type, dict(headers or {})


class BadRequestError(PosencError):
    service_error = errors.BadRequest


class InvalidParameterError(PosencError):
    service_error = errors.InvalidParameter


class ForbiddenError(PosencError):
    service_error = errors.Forbidden


class NotFoundError(PosencError):
    service_error = errors.NotFound


class NotAcceptableError(PosencError):
    service_error = errors.NotAcceptable


class PayloadTooLargeError(PosencError):
    service_error = errors.PayloadTooLarge


class PreconditionFailedError(PosencError):
    service_error = errors.PreconditionFailed


class HeadersTooLargeError(PosencError):
    service_error = errors.HeadersTooLarge


class UnsupportedMediaTypeError(PosencError):
    service_error = errors.UnsupportedMediaType


class RequestTimeoutError(PosencError):
    service_error = errors.RequestTimeout


class ClientClosedRequestError(PosencError):
    service_error = errors.ClientClosedRequest


class InsufficientStorageError(PosencError):
    service_error = errors.InsufficientStorage


class UnavailableError(PosencError):
    """503: overloaded or not ready; `retry_after` is the Retry-After header in seconds (None: not sent)."""

    service_error = errors.Unavailable

    @property
    def retry_after(self) -> int | None:
        value = self.headers.get("retry-after")
        return int(value) if value is not None and value.isdigit() else None


class InvalidResponseError(PosencError):
    """A success answer the client cannot read (not safetensors, not JSON): not an error type of the service."""


ERRORS: tuple[type[PosencError], ...] = (
    BadRequestError, InvalidParameterError, ForbiddenError, NotFoundError, NotAcceptableError, PayloadTooLargeError,
    PreconditionFailedError, HeadersTooLargeError, UnsupportedMediaTypeError, RequestTimeoutError,
    ClientClosedRequestError, InsufficientStorageError, UnavailableError)
BY_TYPE: dict[str, type[PosencError]] = {cls.service_error.error_type: cls for cls in ERRORS}


def error_from_answer(status: int, body: bytes, headers: Mapping[str, str]) -> PosencError:
    """The exception for an error answer: its `type`'s class (PosencError for a type this client does not know)."""
    try:
        doc = json.loads(body)
        message, error_type = str(doc["error"]), doc.get("type")
    except (ValueError, TypeError, KeyError):
        message, error_type = body[:ERROR_TEXT_LIMIT].decode("utf-8", "replace"), None
    cls = BY_TYPE.get(error_type, PosencError) if isinstance(error_type, str) else PosencError
    return cls(status, message, error_type if isinstance(error_type, str) else None,
               {k.lower(): v for k, v in headers.items()})


# ------------------------------------------------------------------------------------------------ tables


class Table(dict[str, np.ndarray]):
    """The tensors of one table answer by name, in the service's order, read-only (they may be shared with the
    client's ETag cache: copy one to change it); `metadata`: the resolved parameters and the service version;
    `etag`: the answer's ETag."""

    def __init__(self, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str], etag: str | None) -> None:
        super().__init__(tensors)
        for array in self.values():
            array.flags.writeable = False
        self.metadata, self.etag = dict(metadata), etag

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.values())


def method_name(path: str) -> str:
    """The client method of a table path: `/v1/rope/from-config` → `rope_from_config`."""
    return path.removeprefix("/v1/").replace("/", "_").replace("-", "_")


def families() -> dict[str, TableRoute]:
    """Every table and properties endpoint the service registers, by client method name."""
    return {method_name(path): route for path, route in table_routes().items()}


def _route(path: str) -> TableRoute:
    route = table_routes().get(path)
    if route is None:
        raise ValueError(f"{path!r} is not a table endpoint; they are: {', '.join(table_routes())}")
    return route


def _query_value(value: Any) -> str:
    """A parameter as the query string spells it: booleans true/false, sequences comma-separated, mappings as
    JSON (a check's `config`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return json.dumps(value)
    if isinstance(value, list | tuple | np.ndarray):
        return ",".join(_query_value(v) for v in value)
    return str(value)


def _query(allowed: Mapping[str, Any], params: Mapping[str, Any], what: str) -> dict[str, str]:
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise TypeError(f"{what} takes no parameter {', '.join(unknown)}; its parameters: {', '.join(allowed)}")
    return {name: _query_value(value) for name, value in params.items() if value is not None}


def _body(body: Any) -> tuple[bytes, str]:
    """A request body and its Content-Type: bytes as .npy or safetensors by their first bytes, an array as .npy,
    a mapping of arrays as safetensors, anything else as JSON."""
    if isinstance(body, bytes | bytearray | memoryview):
        data = bytes(body)
        return data, MEDIA_TYPES["npy" if data.startswith(b"\x93NUMPY") else "safetensors"]
    if isinstance(body, np.ndarray):
        return encode_npy(body), MEDIA_TYPES["npy"]
    if isinstance(body, Mapping) and body and all(isinstance(v, np.ndarray) for v in body.values()):
        return encode_safetensors(body, {}), MEDIA_TYPES["safetensors"]
    return json.dumps(body).encode(), MEDIA_TYPES["json"]


@dataclass(frozen=True)
class Request:
    """One request to send: what `Client` and `AsyncClient` hand to httpx2, and the cache key of a GET."""

    method: str
    path: str
    params: dict[str, str]
    content: bytes | None
    headers: dict[str, str]
    cached: Table | None = None  # the kept answer whose ETag is sent in If-None-Match

    @property
    def key(self) -> str | None:
        return None if self.method != "GET" else self.path + "?" + "&".join(f"{k}={v}" for k, v in
                                                                              sorted(self.params.items()))


class _Answers:
    """What the sync and the async client share: building requests and reading answers (no I/O), the ETag cache."""

    def __init__(self, cache_bytes: int) -> None:
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, Table] = OrderedDict()

    def table_request(self, path: str, body: Any, params: Mapping[str, Any]) -> Request:
        route = _route(path)
        query = _query(route.query.model_fields, params, path)
        query["format"] = "safetensors"
        if (route.query.body is None) != (body is None):
            raise TypeError(f"{path} {'takes a body' if body is None else 'takes no body'} ({route.method})")
        if body is None:
            request = Request("GET", path, query, None, {"Accept": MEDIA_TYPES["safetensors"]})
            cached = self._cache.get(request.key or "")
            if cached is None or not cached.etag:
                return request
            return Request("GET", path, query, None, {**request.headers, "If-None-Match": cached.etag}, cached)
        content, media_type = _body(body)
        return Request("POST", path, query, content, {"Content-Type": media_type})

    def table_answer(self, request: Request, status: int, body: bytes, headers: Mapping[str, str]) -> Table:
        key = request.key
        if status == 304 and request.cached is not None:  # kept by the request: the cache may have dropped it since
            if key is not None and key in self._cache:
                self._cache.move_to_end(key)
            return request.cached
        if status != 200:
            raise error_from_answer(status, body, headers)
        try:
            tensors, metadata = decode_safetensors_bundle(body)
        except errors.BadRequest as exc:
            raise InvalidResponseError(status, f"the answer is not a table: {exc.message}") from None
        table = Table(tensors, metadata, headers.get("etag"))
        if key is not None and table.etag and table.nbytes <= self.cache_bytes:
            self._cache[key] = table
            while sum(t.nbytes for t in self._cache.values()) > self.cache_bytes:
                self._cache.popitem(last=False)
        return table

    def check_request(self, path: str, tensors: Mapping[str, np.ndarray], params: Mapping[str, Any]) -> Request:
        if path not in TABLES:
            raise ValueError(f"{path!r} has no check; the tables are: {', '.join(TABLES)}")
        allowed = {**TABLES[path].query.model_fields, "config": None, "tensor": None}
        query = _query(allowed, params, f"the check of {path}")
        if not tensors:
            raise ValueError("check: give at least one tensor, e.g. {'cos': my_cos}")
        return Request("POST", "/v1/check/" + path.removeprefix("/v1/"), query,
                       encode_safetensors({k: np.asarray(v) for k, v in tensors.items()}, {}),
                       {"Content-Type": MEDIA_TYPES["safetensors"], "Accept": MEDIA_TYPES["json"]})

    @staticmethod
    def json_answer(status: int, body: bytes, headers: Mapping[str, str]) -> Any:
        if status != 200:
            raise error_from_answer(status, body, headers)
        try:
            return json.loads(body)
        except ValueError:
            raise InvalidResponseError(status, "the answer is not JSON") from None


class _Families:
    """Table families as methods: `client.alibi_bias(num_heads=8, ...)` is `client.table("/v1/alibi/bias", ...)`."""

    table: Callable[..., Any]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        route = None if name.startswith("_") else families().get(name)
        if route is None:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r} (table families: "
                                 f"{', '.join(families())})")
        return partial(self.table, route.path)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(families()))


class Client(_Families):
    """Synchronous client of one posenc service (`base_url`), or of any httpx2 client given as `http` (its own
    base URL; e.g. a TestClient on the app). A context manager; `close` closes an httpx2 client it made."""

    def __init__(self, base_url: str = DEFAULT_URL, *, http: httpx2.Client | None = None, timeout: float = 60.0,
                 headers: Mapping[str, str] | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._own = http is None
        self.http: httpx2.Client = http if http is not None else _httpx2().Client(
            base_url=base_url, timeout=timeout, headers=dict(headers or {}))
        self._answers = _Answers(cache_bytes)

    def _send(self, request: Request) -> httpx2.Response:
        return self.http.request(request.method, request.path, params=request.params, content=request.content,
                                 headers=request.headers)

    def table(self, path: str, /, *, body: Any = None, **params: Any) -> Table:
        """The table of `path` (e.g. "/v1/rope") with these query parameters; `body` for the POST families (a
        config.json or segments as a dict, a weight as an array or safetensors/.npy bytes)."""
        request = self._answers.table_request(path, body, params)
        response = self._send(request)
        return self._answers.table_answer(request, response.status_code, response.content, response.headers)

    def check(self, path: str, tensors: Mapping[str, np.ndarray], /, **params: Any) -> dict[str, Any]:
        """Check-my-port: `tensors` (your own table, named as the endpoint's tensors) against the golden table of
        `path` with these parameters; the report (verdict, likely_cause, agreement, diagnosis)."""
        request = self._answers.check_request(path, tensors, params)
        response = self._send(request)
        return self._answers.json_answer(response.status_code, response.content, response.headers)

    def close(self) -> None:
        if self._own:
            self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Families):
    """`Client` for asyncio: the same methods, awaited (`await client.rope(...)`); `http`: an httpx2.AsyncClient
    (e.g. on `httpx2.ASGITransport(app=...)` for the app in-process)."""

    def __init__(self, base_url: str = DEFAULT_URL, *, http: httpx2.AsyncClient | None = None,
                 timeout: float = 60.0, headers: Mapping[str, str] | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._own = http is None
        self.http: httpx2.AsyncClient = http if http is not None else _httpx2().AsyncClient(
            base_url=base_url, timeout=timeout, headers=dict(headers or {}))
        self._answers = _Answers(cache_bytes)

    async def _send(self, request: Request) -> httpx2.Response:
        return await self.http.request(request.method, request.path, params=request.params,
                                       content=request.content, headers=request.headers)

    async def table(self, path: str, /, *, body: Any = None, **params: Any) -> Table:
        """See `Client.table`."""
        request = self._answers.table_request(path, body, params)
        response = await self._send(request)
        return self._answers.table_answer(request, response.status_code, response.content, response.headers)

    async def check(self, path: str, tensors: Mapping[str, np.ndarray], /, **params: Any) -> dict[str, Any]:
        """See `Client.check`."""
        request = self._answers.check_request(path, tensors, params)
        response = await self._send(request)
        return self._answers.json_answer(response.status_code, response.content, response.headers)

    async def aclose(self) -> None:
        if self._own:
            await self.http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

