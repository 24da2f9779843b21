"""The benchmark's server: posenc, plus a bare ASGI echo at `POST /bench/echo` in the same process, run by
posenc's own server (its protocol class, timeouts and body reading: what `posenc serve` runs).

    POSENC_...=... python -m bench.echo_asgi --host 127.0.0.1 --port 8000

The echo is the transport anchor of `python -m bench infer` (bench/infer.py): it reads the request body (N
bytes, into one buffer sized from Content-Length, the way an inference body is read: through the server's
RECEIVE_INTO when it offers one) and answers `X-Echo-Bytes` bytes (M), with no routing, middleware or parsing.
Run on the same server, loop, protocol and process as posenc, the difference between the two is what posenc
itself adds.

With `--grpc-echo-port`, the same process also serves the gRPC echo, the anchor of the gRPC columns: a bare
`grpc.aio` server (what posenc's gRPC service runs on, in the same event loop) whose method `/bench.Echo/Echo`
takes the request's bytes unparsed and answers the number of bytes its `x-echo-bytes` metadata names, with no
protobuf either way. Its `/inference.GRPCInferenceService/ModelInfer` does the same for a client library that
needs a real answer (tritonclient): the request's bytes dropped unparsed, a `ModelInferResponse` answered whose
one output, `output`, holds the zeros of the datatype and shape its `x-echo-output` metadata names
(`FP32:8,8,512,64`), serialized once per shape.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections.abc import AsyncIterator
from functools import cache
from typing import Any

from starlette.types import Receive, Scope, Send

from posenc.service.request_kit.bodies import receive_into_of
from posenc.service.serving.process import app_from_env
from posenc.service.serving.server import Server, build_config
from posenc.service.settings import Settings

ECHO_PATH = "/bench/echo"
ANSWER_HEADER = b"x-echo-bytes"
GRPC_ECHO_METHOD = "/bench.Echo/Echo"
GRPC_ECHO_ENV = "BENCH_GRPC_ECHO"  # host:port of the gRPC echo, for the factory (uvicorn builds the app)
GRPC_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
INFER_ECHO_SERVICE, INFER_ECHO_METHOD = "inference.GRPCInferenceService", "ModelInfer"
INFER_ECHO_KEY = "x-echo-output"  # metadata: the answer's output, `<KServe datatype>:<shape, comma-separated>`


@cache
def _payload(size: int) -> bytes:
    return bytes(size)


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    headers = dict(scope["headers"])
    buffer = bytearray(int(headers.get(b"content-length", b"0")))
    receive_into = receive_into_of(scope)
    if receive_into is not None:
        if await receive_into(memoryview(buffer)) != len(buffer):
            return
    else:
        view, received, more = memoryview(buffer), 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            view[received:received + len(chunk)] = chunk
            received += len(chunk)
            more = message.get("more_body", False)
    body = _payload(int(headers.get(ANSWER_HEADER, b"0")))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/octet-stream"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def grpc_echo(request: bytes, context: Any) -> bytes:
    """The gRPC echo's method: the request's bytes, read and dropped; `x-echo-bytes` bytes back."""
    metadata = dict(context.invocation_metadata())
    return _payload(int(metadata.get(ANSWER_HEADER.decode(), "0")))


def infer_echo_value(datatype: str, shape: tuple[int, ...]) -> str:
    """The `x-echo-output` metadata value of an output of `datatype` (KServe name) and `shape`."""
    return f"{datatype}:{','.join(str(dim) for dim in shape)}"


@cache
def _infer_answer(output: str) -> bytes:
    """The serialized `ModelInferResponse` of the `x-echo-output` value `output`: zeros in `raw_output_contents`."""
    from tritonclient.grpc import service_pb2 as pb

    from posenc.models.dtypes import BY_KSERVE

    datatype, _, dims = output.partition(":")
    shape = [int(dim) for dim in dims.split(",") if dim]
    size = BY_KSERVE[datatype].numpy.itemsize * math.prod(shape)
    response = pb.ModelInferResponse(model_name="echo", outputs=[pb.ModelInferResponse.InferOutputTensor(
        name="output", datatype=datatype, shape=shape)], raw_output_contents=[bytes(size)])
    return response.SerializeToString()


async def grpc_infer_echo(request: bytes, context: Any) -> bytes:
    """The gRPC echo's ModelInfer: the request's bytes, read and dropped; the answer `x-echo-output` names."""
    return _infer_answer(str(dict(context.invocation_metadata()).get(INFER_ECHO_KEY, "FP32:0")))


@contextlib.asynccontextmanager
async def grpc_echo_server(host: str, port: int) -> AsyncIterator[None]:
    """The gRPC echo on `host:port` while the block runs (in the running event loop)."""
    import grpc

    server = grpc.aio.server(options=GRPC_OPTIONS)
    service, method = GRPC_ECHO_METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler(service, {method: grpc.unary_unary_rpc_method_handler(grpc_echo)}),
        grpc.method_handlers_generic_handler(INFER_ECHO_SERVICE, {
            INFER_ECHO_METHOD: grpc.unary_unary_rpc_method_handler(grpc_infer_echo)})))
    if not server.add_insecure_port(f"{host}:{port}"):
        raise RuntimeError(f"the gRPC echo cannot listen on {host}:{port}")
    await server.start()
    try:
        yield
    finally:
        await server.stop(None)


def posenc_with_echo() -> Any:
    """uvicorn factory: posenc from the environment (POSENC_*), with the echo in front of it (and the gRPC echo
    for the server's lifetime where BENCH_GRPC_ECHO is `host:port`)."""
    posenc = app_from_env()
    grpc_address = os.environ.get(GRPC_ECHO_ENV)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == ECHO_PATH:
            await echo(scope, receive, send)
        elif scope["type"] == "lifespan" and grpc_address:
            host, _, port = grpc_address.rpartition(":")
            async with grpc_echo_server(host, int(port)):
                await posenc(scope, receive, send)  # returns when the server shuts down
        else:
            await posenc(scope, receive, send)

    return app


def main(argv: list[str] | None = None) -> int:
    """posenc's server (`posenc serve` with the POSENC_* of the environment) running `posenc_with_echo`."""
    parser = argparse.ArgumentParser(prog="python -m bench.echo_asgi")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--grpc-echo-port", type=int, help="also serve the gRPC echo on this port")
    args = parser.parse_args(argv)
    if args.grpc_echo_port:
        os.environ[GRPC_ECHO_ENV] = f"{args.host}:{args.grpc_echo_port}"
    config = build_config(Settings(host=args.host, port=args.port))
    config.app = f"{__name__}:posenc_with_echo"  # a factory, like posenc's own
    server = Server(config)
    server.run()
    return server.exit_status


if __name__ == "__main__":
    raise SystemExit(main())
