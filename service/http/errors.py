"""Every exception mapped to the one JSON envelope of `posenc.service.errors` (`install_error_handlers`)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from posenc.models.errors import ParameterError
from posenc.service.errors import (
    INTERNAL_MESSAGE,
    ClientClosedRequest,
    InvalidParameter,
    NotFound,
    ServiceError,
    describe_validation_errors,
    error_response,
)

log = logging.getLogger("posenc.http.errors")


def install_error_handlers(app: FastAPI) -> None:
    """Map every exception to the one JSON envelope."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        if isinstance(exc, ClientClosedRequest):
            log.info("client closed the connection during %s %s: %s", request.method, request.url.path, exc.message)
        return error_response(exc.status_code, exc.error_type, exc.message, exc.headers)

    @app.exception_handler(ParameterError)
    async def _parameter_error(_: Request, exc: ParameterError) -> JSONResponse:
        return error_response(422, InvalidParameter.error_type, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, InvalidParameter.error_type, describe_validation_errors(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
            return error_response(404, NotFound.error_type, message)
        if exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
            return error_response(405, "method_not_allowed", message, exc.headers)
        return error_response(exc.status_code, "http_error", str(exc.detail), exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, ServiceError.error_type, INTERNAL_MESSAGE)
