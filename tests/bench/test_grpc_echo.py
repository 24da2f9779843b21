"""The gRPC columns' transport anchor (bench/echo_asgi.py): a bare grpc.aio server that reads a request's bytes
and answers as many as `x-echo-bytes` names (or, to tritonclient's ModelInfer, a response of the output shape
`x-echo-output` names), and how the infer benchmark finds it."""

from __future__ import annotations

import asyncio
import sys

import grpc
import numpy as np

from bench.clients import TritonClients
from bench.echo_asgi import (
    ANSWER_HEADER,
    GRPC_ECHO_METHOD,
    GRPC_OPTIONS,
    INFER_ECHO_KEY,
    grpc_echo_server,
    infer_echo_value,
)
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


def test_tritonclient_gets_from_the_grpc_echo_an_output_of_the_shape_asked_for() -> None:
    """The "gRPC tritonclient echo" column: tritonclient's own gRPC call (InferInputs, infer, as_numpy) against a
    server that adds nothing, so it must parse the echo's answer as a response."""
    port = free_port()
    arrays = {"query": np.ones((2, 3, 4), np.float32), "position_ids": np.arange(4, dtype=np.int64)[None]}

    async def scenario() -> list[np.ndarray]:
        async with grpc_echo_server("127.0.0.1", port):
            clients = TritonClients(None, f"127.0.0.1:{port}")
            try:
                outputs = []
                for datatype, shape in (("FP32", (2, 3, 4)), ("INT64", (5,))):
                    call = clients.calls("m", arrays, {INFER_ECHO_KEY: infer_echo_value(datatype, shape)})["grpc"]
                    outputs.append(await asyncio.to_thread(call))
                return outputs
            finally:
                clients.close()

    first, second = asyncio.run(scenario())
    assert first.dtype == np.float32 and first.shape == (2, 3, 4) and not first.any()
    assert second.dtype == np.int64 and second.shape == (5,)


def test_the_echo_servers_grpc_address_is_the_port_its_arguments_name() -> None:
    arguments = echo_arguments()
    server = ServerProcess(command=[sys.executable, "-m", "bench.echo_asgi", "--host", "{host}", "--port", "{port}",
                                    *arguments], ready=None)
    assert echo_address(server) == f"{server.host}:{arguments[-1]}"
