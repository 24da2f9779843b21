"""The server's RECEIVE_INTO: a body read straight into the handler's buffer as it is parsed, with no pause of the
socket per 64 KiB and no ASGI message per chunk (counted on the protocol with a recording transport); the same
bytes as the chunked path; a body cut short is a disconnect, not a hang."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from starlette.requests import ClientDisconnect
from uvicorn.server import ServerState

from posenc.service.http.protocol import ServerConfig, TimeoutHttpToolsProtocol, Timeouts
from posenc.service.request_kit.bodies import RECEIVE_INTO, read_aligned_body, receive_into_of

BODY = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()  # 1 MiB
CHUNK = 96 * 1024  # over uvicorn's 64 KiB high-water mark: the chunked path pauses reading at each


class RecordingTransport(asyncio.Transport):
    """A transport that keeps what is written and counts the protocol's pauses of reading."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.pauses = 0
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def write(self, data: Any) -> None:
        self.written += data

    def pause_reading(self) -> None:
        self.pauses += 1

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


def _run(use_sink: bool, body: bytes = BODY, cut_after: int | None = None) -> dict[str, Any]:
    """POST `body` in 96 KiB pieces (one loop pass between pieces) to an app that reads it with read_aligned_body,
    through RECEIVE_INTO or through receive(); what the app saw and how often reading was paused."""
    seen: dict[str, Any] = {"messages": 0}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        async def counted() -> Any:
            message = await receive()
            seen["messages"] += 1
            return message

        async def chunks() -> Any:
            while True:
                message = await counted()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    return

        seen["extension"] = receive_into_of(scope) is not None
        try:
            data = await read_aligned_body(str(len(body)), chunks(), 1 << 30, 0,
                                           receive_into=receive_into_of(scope) if use_sink else None)
            seen["body"] = bytes(data)
        except Exception as exc:  # what the route would turn into an answer
            seen["error"] = type(exc).__name__
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async def scenario() -> RecordingTransport:
        config = ServerConfig(app, timeouts=Timeouts(5, 5, 5, 5), lifespan="off", log_level="warning")
        config.load()
        protocol = TimeoutHttpToolsProtocol(config, ServerState(), {})
        transport = RecordingTransport()
        protocol.connection_made(transport)
        protocol.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
        for start in range(0, len(body), CHUNK):
            if cut_after is not None and start >= cut_after:
                protocol.connection_lost(None)
                break
            await asyncio.sleep(0)
            protocol.data_received(body[start:start + CHUNK])
        for _ in range(50):
            await asyncio.sleep(0)
        if cut_after is None:
            protocol.connection_lost(None)
        for _ in range(10):
            await asyncio.sleep(0)
        return transport

    transport = asyncio.run(scenario())
    seen["pauses"] = transport.pauses
    seen["answered"] = transport.written.startswith(b"HTTP/1.1 200")
    return seen


def test_a_body_is_read_into_the_handlers_buffer_without_a_message_or_a_pause_per_chunk() -> None:
    sink, chunked = _run(use_sink=True), _run(use_sink=False)
    assert sink["extension"] and sink["answered"] and chunked["answered"]
    assert sink["body"] == chunked["body"] == BODY
    assert sink["messages"] == 0 and sink["pauses"] == 0
    assert chunked["messages"] >= len(BODY) // CHUNK // 2 and chunked["pauses"] > 0  # the path it replaces


def test_a_client_gone_in_the_middle_of_the_body_is_a_disconnect() -> None:
    seen = _run(use_sink=True, cut_after=len(BODY) // 2)
    assert seen["error"] == "ClientClosedRequest" and "body" not in seen


@pytest.mark.parametrize("size", [0, 100])
def test_small_and_empty_bodies(size: int) -> None:
    seen = _run(use_sink=True, body=BODY[:size])
    assert seen["body"] == BODY[:size] and seen["answered"]


def test_the_extension_is_named_in_the_scope() -> None:
    assert receive_into_of({"extensions": {RECEIVE_INTO: len}}) is len
    assert receive_into_of({}) is None and receive_into_of({"extensions": None}) is None
