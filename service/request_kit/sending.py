"""Responses whose bytes stay counted in the memory budget until the kernel has them.

A body is built within a `MemoryBudget` reservation; once built, it is still held in memory until the
transport has handed its last byte to the kernel, which for a client that reads slowly (or not at all) is
much later. `HeldResponse` carries the release of that reservation (`BodiesInFlight`) and hands it, when it
starts sending, to the connection's protocol through the scope (`SEND_HOLD_SCOPE`, set by
`posenc.service.http.protocol.TimeoutHttpToolsProtocol`): the protocol calls it when its write buffer is empty
after the response, or when the connection is lost. Under a server without that hook (a test client), the
release comes when the response has been passed to the server. A response dropped without being sent
releases when it is garbage.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

SEND_HOLD_SCOPE = "posenc.hold_until_sent"  # scope key: register a release for when the response is sent

HoldUntilSent = Callable[[Callable[[], None]], None]


class HeldResponse(Response):
    """A `Response` of `content` (kept as the same object) whose `release` runs once its bytes are sent."""

    def __init__(self, content: bytes | bytearray, *, release: Callable[[], None], status_code: int = 200,
                 headers: Mapping[str, str] | None = None, media_type: str | None = None) -> None:
        super().__init__(content=content, status_code=status_code, headers=headers, media_type=media_type)
        self._unsent = weakref.finalize(self, release)  # dropped unsent: the bytes come back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        detached = self._unsent.detach()
        if detached is None:
            await self.send_body(scope, receive, send)
            return
        async with released_when_sent(scope, detached[1]):
            await self.send_body(scope, receive, send)

    async def send_body(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response (the start, then the body)."""
        await super().__call__(scope, receive, send)


@asynccontextmanager
async def released_when_sent(scope: Scope, release: Callable[[], None]) -> AsyncIterator[None]:
    """Around sending a response: `release` goes to the connection's protocol, which runs it once the bytes
    are in the kernel (or the connection is lost); without that hook (a test client), it runs after the
    block."""
    hold: HoldUntilSent | None = scope.get(SEND_HOLD_SCOPE)
    if hold is not None:
        hold(release)
        yield
        return
    try:
        yield
    finally:
        release()


async def send_held(scope: Scope, send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes,
                    release: Callable[[], None]) -> None:
    """A response's two ASGI messages, sent directly, with `release` run once its bytes are sent (as
    `HeldResponse` does, for a caller that builds no `Response`)."""
    async with released_when_sent(scope, release):
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
