"""The gRPC columns of `python -m bench infer`: the same request over posenc's gRPC service, on the server the HTTP
columns use (its POSENC_GRPC_PORT turned on), measured side by side with them.

* gRPC raw: the `ModelInferRequest` (inputs in `raw_input_contents`) serialized once, sent with a plain grpcio
  channel, the output read with np.frombuffer: as the HTTP binary column sends its prepared body;
* gRPC tritonclient: `tritonclient.grpc.InferenceServerClient.infer` with InferInputs set once (what a Python
  user writes), `as_numpy` on the result. Its column also holds tritonclient's own work in this process (each
  call copies the inputs into a new message and serializes it: about 35 ms at 25 MB with glibc's defaults,
  docs/grpc.md "Performance");
* HTTP tritonclient: `tritonclient.http.InferenceServerClient.infer` with binary inputs and output, set once the
  same way: the other protocol as the same user runs it (its own client work included too).

Ratios and targets (docs/grpc.md): each protocol against the other as sent the same way, at every case: HTTP
binary / gRPC raw ≥ 1.0 (prepared bodies) and HTTP tritonclient / gRPC tritonclient ≥ 1.0 (what a Python user
runs); onnxruntime / gRPC raw ≥ 0.8 at B·S ≥ 4096 (tritonclient over HTTP reached about half of that).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bench.harness import Row, med, spread
from posenc.service.testing import ServerProcess, free_port

SERVICE = "/inference.GRPCInferenceService/"
GRPC_TARGET = 1.0  # HTTP binary / gRPC, at every case
LARGE_TARGET, LARGE_ROWS = 0.8, 4096  # onnxruntime / gRPC from this B·S on
OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
HEADER = (" | gRPC raw | HTTP tritonclient | gRPC tritonclient | HTTP binary / gRPC raw (≥ 1.0) | HTTP / gRPC, "
          "tritonclient (≥ 1.0) | onnxruntime / gRPC raw (≥ 0.8 at B·S ≥ 4096)")


def server_settings() -> dict[str, object]:
    """The setting that turns gRPC on for the benchmark's server (a free port)."""
    return {"grpc_port": free_port()}


def datatype(array: np.ndarray) -> str:
    from posenc.models.dtypes import lookup

    return lookup(array.dtype).kserve


class GrpcColumns:
    """One channel and one tritonclient client to the server's gRPC port, for every case."""

    def __init__(self, server: ServerProcess) -> None:
        import grpc
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.address = server.grpc_address
        self.channel = grpc.insecure_channel(self.address, options=OPTIONS)
        self.infer = self.channel.unary_unary(SERVICE + "ModelInfer")
        self.client = grpcclient.InferenceServerClient(self.address)
        self.http_client = httpclient.InferenceServerClient(server.address, network_timeout=600.0)

    def calls(self, model: str, arrays: dict[str, np.ndarray]) -> dict[str, Callable[[], Any]]:
        """The columns' calls for one case (each returns the output array)."""
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient
        from tritonclient.grpc import service_pb2 as pb

        request = pb.ModelInferRequest(model_name=model)
        tensors, http_tensors = [], []
        for name, array in arrays.items():
            request.inputs.add(name=name, datatype=datatype(array), shape=array.shape)
            request.raw_input_contents.append(array.tobytes())
            tensor = grpcclient.InferInput(name, list(array.shape), datatype(array))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
            http_tensor = httpclient.InferInput(name, list(array.shape), datatype(array))
            http_tensor.set_data_from_numpy(array, binary_data=True)
            http_tensors.append(http_tensor)
        http_outputs = [httpclient.InferRequestedOutput("output", binary_data=True)]
        data = request.SerializeToString()

        def raw() -> np.ndarray:
            response = pb.ModelInferResponse.FromString(self.infer(data, timeout=600))
            output = response.outputs[0]
            return np.frombuffer(response.raw_output_contents[0], np.float32).reshape(tuple(output.shape))

        def triton() -> np.ndarray:
            return self.client.infer(model, tensors, client_timeout=600).as_numpy("output")

        def triton_http() -> np.ndarray:
            return self.http_client.infer(model, http_tensors, outputs=http_outputs).as_numpy("output")

        return {"grpc": raw, "grpc tritonclient": triton, "http tritonclient": triton_http}

    def cells(self, times: dict[str, list[float]]) -> str:
        """The case's cells of the latency table (after the HTTP columns)."""
        ms = {name: med(values) for name, values in times.items()}
        return (f" | {ms['grpc']:.2f} ms | {ms['http tritonclient']:.2f} ms | {ms['grpc tritonclient']:.2f} ms"
                f" | {ms['binary'] / ms['grpc']:.2f} | {ms['http tritonclient'] / ms['grpc tritonclient']:.2f}"
                f" | {ms['ort'] / ms['grpc']:.2f}")

    def rows(self, model: str, batch: int, seq: int, times: dict[str, list[float]]) -> list[Row]:
        """The case's ratio rows, with their targets."""
        where = f"{model} B={batch} S={seq}"
        grpc, triton, binary, ort = times["grpc"], times["grpc tritonclient"], times["binary"], times["ort"]
        triton_http = times["http tritonclient"]
        large = batch * seq >= LARGE_ROWS
        # two identical onnxruntime anchors measured the same way (bench/infer.py): outside 1 ± 3 % a row is NOISY
        control = med(times["ort twin"]) / med(ort) if "ort twin" in times else None
        rows = [
            Row(f"gRPC raw vs HTTP binary {where}", med(grpc), med(binary), "ms", False, GRPC_TARGET,
                f"{spread(grpc, binary, False)}; ratio = HTTP binary latency / gRPC latency"),
            Row(f"gRPC tritonclient vs HTTP tritonclient {where}", med(triton), med(triton_http), "ms", False,
                GRPC_TARGET, f"{spread(triton, triton_http, False)}; what a Python user runs on each protocol"),
            Row(f"gRPC raw vs in-process onnxruntime {where}", med(grpc), med(ort), "ms", False,
                LARGE_TARGET if large else None, f"{spread(grpc, ort, False)}; ratio = onnxruntime's share"),
            Row(f"gRPC tritonclient vs in-process onnxruntime {where}", med(triton), med(ort), "ms", False,
                LARGE_TARGET if large else None, spread(triton, ort, False)),
        ]
        if control is not None:
            for row in rows:
                row.control = control
        return rows

    def close(self) -> None:
        self.client.close()
        self.http_client.close()
        self.channel.close()
