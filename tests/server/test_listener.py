"""A busy event loop still accepts a burst of new connections at once (posenc.service.http.listener).

Under uvloop, the loop's own server accepted one connection per iteration: with the loop busy (tens of ms
per iteration under load), a burst of connections waited seconds in the kernel's queue, and the soak's
clients that open a connection per request met their timeouts before the server had even accepted them.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from posenc.service.http.listener import ACCEPT_BATCH, Listener
from posenc.service.serving.server import Server, build_config
from posenc.service.settings import Settings

BURST = 60  # connections completed by the kernel before the loop looks at the listener
BUSY_SECONDS = 0.01  # what each iteration of the loop spends on other work


class Counted(asyncio.Protocol):
    """Keeps every transport it is given in `made`."""

    def __init__(self, made: list[asyncio.Transport]) -> None:
        self.made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(transport)  # type: ignore[arg-type]  # (uvloop's transports are not asyncio's classes)


def run_on(loop_kind: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    factory = uvloop.new_event_loop if loop_kind == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def listening_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


async def iterations_until_accepted(listener_sock: socket.socket, made: list[asyncio.Transport]) -> int:
    """Connect `BURST` clients while the loop is blocked, then keep each loop iteration busy; how many
    iterations passed until every connection had its protocol."""
    clients = [socket.create_connection(listener_sock.getsockname()) for _ in range(BURST)]
    iterations = 0
    try:
        while len(made) < BURST and iterations < 10 * BURST:
            time.sleep(BUSY_SECONDS)  # the rest of the loop's work in this iteration
            await asyncio.sleep(0)
            iterations += 1
        return iterations
    finally:
        for client in clients:
            client.close()
        for transport in made:
            transport.close()


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
def test_a_burst_is_accepted_within_a_few_iterations_of_a_busy_loop(loop_kind: str) -> None:
    made: list[asyncio.Transport] = []

    async def main() -> None:
        sock = listening_socket()
        listener = Listener(sock, lambda: Counted(made), 2048,
                            asyncio.get_running_loop())
        try:
            iterations = await iterations_until_accepted(sock, made)
        finally:
            listener.close()
        assert len(made) == BURST
        assert iterations <= 5, f"{BURST} waiting connections took {iterations} loop iterations to accept"

    run_on(loop_kind, main)


def test_a_batch_leaves_the_rest_for_the_next_iteration() -> None:
    """At most ACCEPT_BATCH per readiness: a flood of connections does not starve the connections already open."""
    made: list[asyncio.Transport] = []

    async def main() -> None:
        sock = listening_socket()
        clients: list[socket.socket] = []
        listener = Listener(sock, lambda: Counted(made), 4096,
                            asyncio.get_running_loop())
        try:
            clients = [socket.create_connection(sock.getsockname()) for _ in range(ACCEPT_BATCH + 10)]
            listener.accept_waiting()  # one readiness, by hand
            assert len(listener.connecting) == ACCEPT_BATCH
            for _ in range(20):
                await asyncio.sleep(0)
            assert len(made) == ACCEPT_BATCH + 10  # the rest on the next iterations (the socket stays readable)
        finally:
            listener.close()
            for client in clients:
                client.close()
            for transport in made:
                transport.close()

    run_on("uvloop", main)


def test_a_closed_listener_refuses_new_connections() -> None:
    async def main() -> None:
        sock = listening_socket()
        address = sock.getsockname()
        listener = Listener(sock, asyncio.Protocol, 16, asyncio.get_running_loop())
        listener.close()
        listener.close()  # twice is harmless
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=2)

    run_on("uvloop", main)


def test_the_server_listens_through_listeners() -> None:
    """`posenc serve`'s single-process server (not the loop's own server) owns the listening socket."""
    server = Server(build_config(Settings(log_level="warning")))

    async def main() -> None:
        sock = listening_socket()
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                assert not serving.done(), "the server stopped during startup"
                await asyncio.sleep(0.01)
            assert [listener.sockets for listener in server.listeners] == [[sock]]
            with socket.create_connection(sock.getsockname()) as client:
                client.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                client.settimeout(10)
                answer = await asyncio.get_running_loop().run_in_executor(None, client.recv, 65536)
            assert answer.startswith(b"HTTP/1.1 200")
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)
        assert sock.fileno() == -1  # closed by the shutdown

    run_on("uvloop", main)
