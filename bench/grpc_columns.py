"""The gRPC columns of `python -m bench infer`: the same request over posenc's gRPC service, on the server the HTTP
columns use (its POSENC_GRPC_PORT turned on), measured side by side with them.

* gRPC raw: the `ModelInferRequest` (inputs in `raw_input_contents`) serialized once, sent with a plain grpcio
  channel, the output read with np.frombuffer: as the HTTP binary column sends its prepared body;
* gRPC tritonclient: `tritonclient.grpc.InferenceServerClient.infer` with InferInputs set once (what a Python
  user writes), `as_numpy` on the result. Its column also holds tritonclient's own work in this process (each
  call copies the inputs into a new message and serializes it: about 35 ms at 25 MB with glibc's defaults,
  docs/grpc.md "Performance");
* HTTP tritonclient: `tritonclient.http.InferenceServerClient.infer` with binary inputs and output, set once the
  same way: the other protocol as the same user runs it (its own client work included too);
* gRPC echo: the gRPC raw column's request bytes sent the same way to a bare `grpc.aio` server in a process of its
  own (`bench/echo_asgi.py`, `--grpc-echo-port`) that answers as many bytes as posenc's response holds: the
  transport alone, the anchor of what posenc's gRPC service adds, as the echo is for HTTP. onnxruntime /
  (onnxruntime + gRPC echo) is the most onnxruntime / gRPC raw can read on the machine even if posenc added
  nothing but the run.
* gRPC tritonclient echo: the gRPC tritonclient column's call (the same InferInputs, `infer`, `as_numpy`) sent to
  that echo's ModelInfer, which drops the request unparsed and answers a response of posenc's output shape: the
  client library and the transport alone. onnxruntime plus it is the least any gRPC server can answer that client
  in, so HTTP tritonclient / (onnxruntime + gRPC tritonclient echo) is the most the "HTTP / gRPC, tritonclient"
  ratio can read on the machine, and a peer's gRPC latency over that sum the most lead any server can take over it.

Ratios and targets (docs/grpc.md): each protocol against the other as sent the same way, at every case: HTTP
binary / gRPC raw ≥ 1.0 (prepared bodies) and HTTP tritonclient / gRPC tritonclient ≥ 1.0 (what a Python user
runs); onnxruntime / gRPC raw ≥ 0.8 at B·S ≥ 4096 (tritonclient over HTTP reached about half of that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bench.clients import TritonClients, datatype
from bench.echo_asgi import ANSWER_HEADER, GRPC_ECHO_METHOD, GRPC_OPTIONS, INFER_ECHO_KEY, infer_echo_value
from bench.harness import Row, med, spread
from posenc.service.request_kit import phases
from posenc.service.testing import ServerProcess, free_port

SERVICE = "/inference.GRPCInferenceService/"
GRPC_TARGET = 1.0  # HTTP binary / gRPC, at every case
LARGE_TARGET, LARGE_ROWS = 0.8, 4096  # onnxruntime / gRPC from this B·S on
OPTIONS = GRPC_OPTIONS  # no message size limit on the client's side (the server's own limits apply)
HEADER = (" | gRPC echo | gRPC raw | HTTP tritonclient | gRPC tritonclient | gRPC tritonclient echo "
          "| HTTP binary / gRPC raw (≥ 1.0) | HTTP / gRPC, tritonclient (≥ 1.0) "
          "| its bound: HTTP tritonclient / (onnxruntime + gRPC tritonclient echo) "
          "| onnxruntime / gRPC raw (≥ 0.8 at B·S ≥ 4096) | its bound: onnxruntime / (onnxruntime + gRPC echo)")
COLUMNS = 10  # the table's columns above


def server_settings() -> dict[str, object]:
    """The setting that turns gRPC on for the benchmark's server (a free port)."""
    return {"grpc_port": free_port()}


def echo_arguments() -> list[str]:
    """The echo server's arguments that make it serve the gRPC echo too (a free port)."""
    return ["--grpc-echo-port", str(free_port())]


def echo_address(server: ServerProcess) -> str:
    """`host:port` of the gRPC echo of an echo server started with `echo_arguments`."""
    return f"{server.host}:{server.argv[server.argv.index('--grpc-echo-port') + 1]}"


def request_bytes(model: str, arrays: dict[str, np.ndarray]) -> bytes:
    """The serialized `ModelInferRequest` of `arrays`, each input in `raw_input_contents`."""
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model)
    for name, array in arrays.items():
        request.inputs.add(name=name, datatype=datatype(array), shape=array.shape)
        request.raw_input_contents.append(array.tobytes())
    return request.SerializeToString()


class GrpcColumns:
    """One channel and one tritonclient client to the server's gRPC port, for every case."""

    def __init__(self, server: ServerProcess, echo_server: ServerProcess) -> None:
        import grpc

        self.address = server.grpc_address
        self.channel = grpc.insecure_channel(self.address, options=OPTIONS)
        self.infer = self.channel.unary_unary(SERVICE + "ModelInfer")
        self.echo_channel = grpc.insecure_channel(echo_address(echo_server), options=OPTIONS)
        self.echo = self.echo_channel.unary_unary(GRPC_ECHO_METHOD)
        # tritonclient over both protocols: the same code measures PyTriton (bench/peer_columns.py)
        self.triton = TritonClients(server.address, self.address)
        self.triton_echo = TritonClients(None, echo_address(echo_server))

    def calls(self, model: str, arrays: dict[str, np.ndarray]) -> dict[str, Callable[[], Any]]:
        """The columns' calls for one case (each returns the output array)."""
        from tritonclient.grpc import service_pb2 as pb

        data = request_bytes(model, arrays)

        def raw() -> np.ndarray:
            response = pb.ModelInferResponse.FromString(self.infer(data, timeout=600))
            output = response.outputs[0]
            return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(tuple(output.shape))

        answer = self.infer(data, timeout=600)  # posenc's response: its size and output, what the echoes answer
        echo_metadata = ((ANSWER_HEADER.decode(), str(len(answer))),)
        output = pb.ModelInferResponse.FromString(answer).outputs[0]

        def echo() -> bytes:
            return self.echo(data, metadata=echo_metadata, timeout=600)

        triton = self.triton.calls(model, arrays)
        triton_echo = self.triton_echo.calls(model, arrays, {INFER_ECHO_KEY: infer_echo_value(
            output.datatype, tuple(output.shape))})["grpc"]
        return {"grpc": raw, "grpc echo": echo, "grpc tritonclient": triton["grpc"],
                "http tritonclient": triton["http"], "grpc tritonclient echo": triton_echo}

    def timing_call(self, model: str, arrays: dict[str, np.ndarray]) -> Callable[[], str | None]:
        """A call of the gRPC raw column that answers its `server-timing` trailing metadata (the server's phases)."""
        data = request_bytes(model, arrays)

        def timing() -> str | None:
            _, call = self.infer.with_call(data, timeout=600)
            return dict(call.trailing_metadata() or ()).get(phases.TRAILER)

        return timing

    def cells(self, times: dict[str, list[float]]) -> str:
        """The case's cells of the latency table (after the HTTP columns)."""
        ms = {name: med(values) for name, values in times.items()}
        return (f" | {ms['grpc echo']:.2f} ms | {ms['grpc']:.2f} ms | {ms['http tritonclient']:.2f} ms"
                f" | {ms['grpc tritonclient']:.2f} ms | {ms['grpc tritonclient echo']:.2f} ms"
                f" | {ms['binary'] / ms['grpc']:.2f} | {ms['http tritonclient'] / ms['grpc tritonclient']:.2f}"
                f" | {ms['http tritonclient'] / (ms['ort'] + ms['grpc tritonclient echo']):.2f}"
                f" | {ms['ort'] / ms['grpc']:.2f} | {ms['ort'] / (ms['ort'] + ms['grpc echo']):.2f}")

    def rows(self, model: str, batch: int, seq: int, times: dict[str, list[float]]) -> list[Row]:
        """The case's ratio rows, with their targets."""
        where = f"{model} B={batch} S={seq}"
        grpc, triton, binary, ort = times["grpc"], times["grpc tritonclient"], times["binary"], times["ort"]
        echo, triton_echo = times["grpc echo"], times["grpc tritonclient echo"]
        triton_http = times["http tritonclient"]
        large = batch * seq >= LARGE_ROWS
        # two identical onnxruntime anchors measured the same way (bench/infer.py): outside 1 ± 3 % a row is NOISY
        control = med(times["ort twin"]) / med(ort) if "ort twin" in times else None
        rows = [
            Row(f"gRPC raw vs HTTP binary {where}", med(grpc), med(binary), "ms", False, GRPC_TARGET,
                f"{spread(grpc, binary, False)}; ratio = HTTP binary latency / gRPC latency"),
            Row(f"gRPC tritonclient vs HTTP tritonclient {where}", med(triton), med(triton_http), "ms", False,
                GRPC_TARGET, f"{spread(triton, triton_http, False)}; what a Python user runs on each protocol"),
            Row(f"onnxruntime + gRPC tritonclient echo vs HTTP tritonclient {where}", med(ort) + med(triton_echo),
                med(triton_http), "ms", False, None, "the bound of HTTP / gRPC, tritonclient: the run, tritonclient's "
                "gRPC client and the transport alone, a server adding nothing else"),
            Row(f"gRPC raw vs in-process onnxruntime {where}", med(grpc), med(ort), "ms", False,
                LARGE_TARGET if large else None, f"{spread(grpc, ort, False)}; ratio = onnxruntime's share"),
            Row(f"gRPC tritonclient vs in-process onnxruntime {where}", med(triton), med(ort), "ms", False,
                LARGE_TARGET if large else None, spread(triton, ort, False)),
            Row(f"onnxruntime + gRPC echo vs in-process onnxruntime {where}", med(ort) + med(echo), med(ort), "ms",
                False, None, "the bound of onnxruntime / gRPC raw: the run and the transport alone, posenc adding "
                "nothing else"),
            Row(f"(gRPC raw - onnxruntime) / gRPC echo {where}", med(grpc) - med(ort), med(echo), "ms", True, None,
                "what posenc's gRPC service adds to the run, in echoes", at_most=True),
        ]
        if control is not None:
            for row in rows:
                row.control = control
        return rows

    def close(self) -> None:
        self.triton.close()
        self.triton_echo.close()
        self.channel.close()
        self.echo_channel.close()
