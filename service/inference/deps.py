"""The inference room's typed dependency: the app's data plane, so that no route of the room reads `app.state`.

`create_app` (`posenc.service.http.app`) puts the plane on the app's state once its lifespan has started.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from posenc.service.errors import Unavailable
from posenc.service.inference.dataplane import DataPlane


async def dataplane_of(request: Request) -> DataPlane:
    """The data plane; 503 while the service is starting (before its lifespan has made it)."""
    plane: DataPlane | None = getattr(request.app.state, "dataplane", None)
    if plane is None:
        raise Unavailable("the service is starting: models are not loaded yet", retry_after=1)
    return plane


DataPlaneDep = Annotated[DataPlane, Depends(dataplane_of)]
