"""The inference room's typed dependency: the app's data plane, so that no route of the room reads the app's state.

The process (`posenc.service.process.ServiceProcess`) makes the plane when it starts.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, Request

from posenc.service.errors import Unavailable
from posenc.service.inference.dataplane import DataPlane


class InferenceParts(Protocol):
    """What the inference room reads of the process."""

    dataplane: DataPlane | None


async def dataplane_of(request: Request) -> DataPlane:
    """The data plane; 503 while the service is starting (before its lifespan has made it)."""
    parts: InferenceParts = request.app.state.process
    plane = parts.dataplane
    if plane is None:
        raise Unavailable("the service is starting: models are not loaded yet", retry_after=1)
    return plane


DataPlaneDep = Annotated[DataPlane, Depends(dataplane_of)]
