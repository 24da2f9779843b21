"""Liveness and readiness."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service import __version__
from service.errors import Unavailable, error_response

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok", "version": __version__}


@router.get("/readyz", summary="Readiness: start-up finished and every model loaded")
def readyz(request: Request) -> JSONResponse:
    problems: list[str] = list(getattr(request.app.state, "readiness_problems", ["starting"]))
    if problems:
        return error_response(503, Unavailable.error_type, "not ready: " + "; ".join(problems),
                              status="not ready", problems=problems)
    return JSONResponse({"status": "ready", "version": __version__})
