"""Liveness and readiness."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from posenc.service import __version__
from posenc.service.errors import Unavailable, error_response
from posenc.service.request_kit.deps import ReadinessDep

router = APIRouter(tags=["operations"])


# Liveness is polled constantly (probes, load balancers): its answer is encoded once, and the fast path
# (`posenc.service.http.fastpath`) sends it without routing; this route documents it and answers when called directly.
LIVENESS_PATH = "/healthz"
LIVE = b'{"status":"ok","version":"%s"}' % __version__.encode()


@router.get(LIVENESS_PATH, summary="Liveness: the process answers", response_class=JSONResponse,
            responses={200: {"content": {"application/json": {"schema": {
                "type": "object", "properties": {"status": {"type": "string"}, "version": {"type": "string"}}}}}}})
async def healthz() -> Response:
    return Response(LIVE, media_type="application/json")


@router.get("/readyz", summary="Readiness: start-up finished and every model loaded")
async def readyz(problems: ReadinessDep) -> JSONResponse:
    if problems:
        return error_response(503, Unavailable.error_type, "not ready: " + "; ".join(problems),
                              status="not ready", problems=problems)
    return JSONResponse({"status": "ready", "version": __version__})
