"""Liveness and readiness."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service import __version__

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="Liveness: the process answers")
def healthz() -> dict[str, str]:
    return {"status": "ok", "version": __version__}


@router.get("/readyz", summary="Readiness: start-up finished and every model loaded")
def readyz(request: Request) -> JSONResponse:
    problems: list[str] = list(getattr(request.app.state, "readiness_problems", ["starting"]))
    if problems:
        return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
    return JSONResponse({"status": "ready", "version": __version__})
