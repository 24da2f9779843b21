"""The gRPC columns' transport anchor (bench/echo_asgi.py): a bare grpc.aio server that reads a request's bytes
and answers as many as `x-echo-bytes` names, and how the infer benchmark finds it."""

from __future__ import annotations

import asyncio
import sys

import grpc

from bench.echo_asgi import ANSWER_HEADER, GRPC_ECHO_METHOD, GRPC_OPTIONS, grpc_echo_server
from bench.grpc_columns import echo_address, echo_arguments
from posenc.service.testing import ServerProcess, free_port


def test_the_grpc_echo_answers_the_bytes_asked_for() -> None:
    port = free_port()

    async def scenario() -> list[int]:
        async with grpc_echo_server("127.0.0.1", port), \
                grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS) as channel:
            echo = channel.unary_unary(GRPC_ECHO_METHOD)
            sizes = []
            for asked in (200_000, 5 << 20, 0):
                answer = await echo(bytes(3 << 20), metadata=((ANSWER_HEADER.decode(), str(asked)),), timeout=30)
                sizes.append(len(answer))
            sizes.append(len(await echo(b"\x01" * 10, timeout=30)))  # no metadata: nothing back
            return sizes

    assert asyncio.run(scenario()) == [200_000, 5 << 20, 0, 0]


def test_the_echo_servers_grpc_address_is_the_port_its_arguments_name() -> None:
    arguments = echo_arguments()
    server = ServerProcess(command=[sys.executable, "-m", "bench.echo_asgi", "--host", "{host}", "--port", "{port}",
                                    *arguments], ready=None)
    assert echo_address(server) == f"{server.host}:{arguments[-1]}"
