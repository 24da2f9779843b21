"""One error taxonomy for the whole service, mapped to HTTP in one place (`posenc.service.http.errors`).

Every error response has the envelope `{"error": "<message a person can act on>", "type": "<code>"}`.
Unexpected exceptions are logged with their traceback and answered with a generic 500.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where a response is built: the CLI imports this module without the web framework
    from fastapi.responses import JSONResponse


class ServiceError(Exception):
    """Base of every error the service answers on purpose."""

    status_code = 500
    error_type = "internal"

    def __init__(self, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = dict(headers or {})


class BadRequest(ServiceError):
    """Malformed body or bytes (400)."""

    status_code = 400
    error_type = "bad_request"


class InvalidParameter(ServiceError):
    """A parameter value outside its allowed range (422); the message names the parameter."""

    status_code = 422
    error_type = "invalid_parameter"


class Forbidden(ServiceError):
    """The request needs a right it does not carry (403): a restricted protocol group's header
    (POSENC_RESTRICTED_API), or, for shared memory, a Unix-socket peer that may open the object itself."""

    status_code = 403
    error_type = "forbidden"


class NotFound(ServiceError):
    """The named thing does not exist (404): a model or model version, a shared-memory region, an asset."""

    status_code = 404
    error_type = "not_found"


class NotAcceptable(ServiceError):
    """Unsupported response format (406)."""

    status_code = 406
    error_type = "not_acceptable"


class PayloadTooLarge(ServiceError):
    """Request or response larger than a configured limit (413)."""

    status_code = 413
    error_type = "too_large"


class PreconditionFailed(ServiceError):
    """A conditional request's precondition does not hold (412): If-None-Match on a non-GET table request
    matches the current representation."""

    status_code = 412
    error_type = "precondition_failed"


class HeadersTooLarge(ServiceError):
    """The request's head (request line and headers) is larger than POSENC_MAX_HEADER_BYTES (431); the
    connection is closed, since the rest of the head is not read."""

    status_code = 431
    error_type = "request_header_fields_too_large"


class UnsupportedMediaType(ServiceError):
    """The request body's Content-Type is not one the route reads (415)."""

    status_code = 415
    error_type = "unsupported_media_type"


class RequestTimeout(ServiceError):
    """A request's bytes did not arrive in time (408)."""

    status_code = 408
    error_type = "request_timeout"


class ClientClosedRequest(ServiceError):
    """The client went away before its request was read (nginx's 499): not a server error. Nobody is
    left to read the answer; the status is for the metrics and the access log."""

    status_code = 499
    error_type = "client_closed_request"


class InsufficientStorage(ServiceError):
    """The model ran out of memory on its device although the request was admitted (507); nothing is left
    allocated and the next request runs normally."""

    status_code = 507
    error_type = "insufficient_storage"


class Unavailable(ServiceError):
    """Overloaded or not ready (503); `retry_after` seconds go into the Retry-After header. `overloaded`: too busy
    now (a model's queue or the memory budget is full), which gRPC answers RESOURCE_EXHAUSTED where a model or
    server that is not ready is UNAVAILABLE."""

    status_code = 503
    error_type = "unavailable"

    def __init__(self, message: str, *, retry_after: int | None = None, overloaded: bool = False) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after)} if retry_after else None)
        self.overloaded = overloaded


# The gRPC status (its code's name: this module imports no gRPC) of each HTTP status of the taxonomy; any other
# status is INTERNAL. The one table both protocols answer by (`grpc_code_name`; HTTP answers the status itself).
GRPC_CODE_NAMES: dict[int, str] = {
    400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 406: "INVALID_ARGUMENT",
    408: "DEADLINE_EXCEEDED", 412: "FAILED_PRECONDITION", 413: "RESOURCE_EXHAUSTED", 415: "INVALID_ARGUMENT",
    422: "INVALID_ARGUMENT", 431: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 503: "UNAVAILABLE", 507: "RESOURCE_EXHAUSTED",
}
INTERNAL_MESSAGE = "internal server error; the service log has the details"  # the text of a 500 (and of INTERNAL)


def grpc_code_name(exc: ServiceError) -> str:
    """The gRPC status code's name for `exc`: its HTTP status's (`GRPC_CODE_NAMES`), but RESOURCE_EXHAUSTED for a
    503 that says the server is too busy now (`Unavailable.overloaded`) rather than not ready."""
    if isinstance(exc, Unavailable) and exc.overloaded:
        return "RESOURCE_EXHAUSTED"
    return GRPC_CODE_NAMES.get(exc.status_code, "INTERNAL")


ECHO_LIMIT = 200  # characters of a client's own input repeated in an error message


def echo(value: str) -> str:
    """`repr` of client input for an error message, cut at ECHO_LIMIT characters (a 1 MB header stays out)."""
    if len(value) <= ECHO_LIMIT:
        return repr(value)
    return f"{value[:ECHO_LIMIT]!r}… ({len(value)} characters)"


# A gRPC status message travels percent-encoded in the `grpc-message` trailer, and a client refuses metadata over
# its limit (16 KiB in tritonclient's channel) with RESOURCE_EXHAUSTED, losing the status: it is cut to this many
# bytes on the wire (`grpc_details`).
GRPC_DETAILS_BYTES = 4096
LISTED_NAMES = 20  # names an error message lists (`listed`); the rest are counted


def listed(names: Sequence[str], limit: int = LISTED_NAMES) -> str:
    """Names of a client's request for an error message: a list as `repr` writes it (each name `echo`ed), its first
    `limit` names and "and N more" for the rest (a request of 20,000 names makes no 20,000-name message)."""
    shown = "[" + ", ".join(echo(name) for name in names[:limit]) + "]"
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _wire_bytes(char: str) -> int:
    """The bytes of one character in a percent-encoded `grpc-message`: printable ASCII but '%' stays as it is, any
    other byte of its UTF-8 is written %XX."""
    code = ord(char)
    if 0x20 <= code <= 0x7E and char != "%":
        return 1
    return 3 * (1 if code < 0x80 else 2 if code < 0x800 else 3 if code < 0x10000 else 4)


def grpc_details(message: str, limit: int = GRPC_DETAILS_BYTES) -> str:
    """`message` as a gRPC status message: whole when it fits in `limit` bytes on the wire, else cut there and ended
    with the count of characters left out. Linear in `limit`, whatever the message's length."""
    room = limit - 64  # the suffix: "… (N more characters)", the ellipsis percent-encoded
    used, cut = 0, None
    for index, char in enumerate(message):
        used += _wire_bytes(char)
        if cut is None and used > room:
            cut = index
        if used > limit:
            assert cut is not None
            return f"{message[:cut]}… ({len(message) - cut} more characters)"
    return message


def format_bytes(n: int) -> str:
    """A byte count for an error message: exact, and in MiB."""
    return f"{n} bytes ({n / 2**20:.1f} MiB)"


def error_response(status_code: int, error_type: str, message: str,
                   headers: Mapping[str, str] | None = None, **extra: Any) -> JSONResponse:
    """The one error envelope `{"error", "type"}`; `extra` keys (e.g. readiness details) come after them."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": message, "type": error_type, **extra}, status_code=status_code,
                        headers=dict(headers or {}))


def _describe_validation_error(err: Mapping[str, Any]) -> str:
    """One line per pydantic error: `<parameter>: <what is allowed> (got <value>)`."""
    loc: Sequence[Any] = err.get("loc", ())
    where = [str(part) for part in loc if part not in ("query", "path", "header", "body")]
    name = ".".join(where) or "request"
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    got = err.get("input")
    if kind == "missing":
        return f"{name}: required parameter is missing"
    bounds = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"),
              "less_than_equal": ("<=", "le"), "less_than": ("<", "lt")}
    if kind in bounds:
        symbol, key = bounds[kind]
        return f"{name}: must be {symbol} {ctx.get(key)} (got {got!r})"
    if kind == "literal_error" and "expected" in ctx:
        return f"{name}: must be one of {ctx['expected']} (got {got!r})"
    return f"{name}: {err.get('msg', 'invalid value')} (got {got!r})"


def describe_validation_errors(errors: Sequence[Mapping[str, Any]]) -> str:
    """pydantic/FastAPI validation errors as one message naming each parameter."""
    return "; ".join(_describe_validation_error(e) for e in errors)
