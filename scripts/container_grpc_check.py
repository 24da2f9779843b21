"""gRPC checks of a running posenc service (needs grpcio, grpcio-health-checking, grpcio-reflection and
tritonclient[grpc]: the test environment's python).

    python scripts/container_grpc_check.py HOST:PORT --model NAME [--causal]

Checks: grpc.health.v1 answers SERVING for the server and inference.GRPCInferenceService (what the Kubernetes
readiness probe asks) and for the model; server reflection lists the services (what grpcurl asks first);
tritonclient.grpc sees the server live and ready and the model's metadata; one ModelInfer with raw tensors (for a
causal model position 0 attends only to itself, so its output is value[0]); an unknown model is NOT_FOUND, not an
internal error. Exit status 0 = all good; a failure prints one line to stderr.
"""

from __future__ import annotations

import argparse
import sys

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.utils import InferenceServerException

SERVICE = "inference.GRPCInferenceService"


class CheckFailed(Exception):
    pass


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def check_health(channel: grpc.Channel, model: str) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for name in ("", SERVICE, model):
        status = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
        expect(status == health_pb2.HealthCheckResponse.SERVING, f"health of {name!r}: {status}")


def check_reflection(channel: grpc.Channel) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    (answer,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
    names = {service.name for service in answer.list_services_response.service}
    expect({SERVICE, "grpc.health.v1.Health"} <= names, f"reflection lists {sorted(names)}")


def check_infer(address: str, model: str, causal: bool) -> None:
    client = grpcclient.InferenceServerClient(address)
    expect(client.is_server_live() and client.is_server_ready(), "tritonclient: server not live and ready")
    metadata = client.get_model_metadata(model, as_json=True)
    shapes = {tensor["name"]: [int(d) for d in tensor["shape"]] for tensor in metadata["inputs"]}
    rng = np.random.default_rng(0)
    arrays = {}
    for tensor in metadata["inputs"]:
        dims = [1 if i == 0 else (3 if d == -1 else d) for i, d in enumerate(shapes[tensor["name"]])]
        if tensor["datatype"] == "INT64":
            arrays[tensor["name"]] = np.broadcast_to(np.arange(dims[-1], dtype=np.int64), dims).copy()
        else:
            arrays[tensor["name"]] = rng.standard_normal(dims).astype(np.float32)
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "INT64" if array.dtype == np.int64 else "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    output = client.infer(model, inputs, request_id="container-grpc-check").as_numpy("output")
    expect(output is not None and np.isfinite(output).all(), "infer: no finite output")
    if causal:
        value = arrays["value"]
        group = output.shape[1] // value.shape[1]
        for head in range(output.shape[1]):
            diff = float(np.abs(output[0, head, 0] - value[0, head // group, 0]).max())
            expect(diff < 1e-5, f"infer: head {head} position 0 differs from value[0] by {diff}")
    try:
        client.get_model_metadata("no_such_model")
        raise CheckFailed("an unknown model was answered")
    except InferenceServerException as exc:
        expect(exc.status() == "StatusCode.NOT_FOUND", f"unknown model: {exc.status()} {exc.message()}")
    client.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--model", required=True)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    try:
        with grpc.insecure_channel(args.address) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            check_health(channel, args.model)
            check_reflection(channel)
        check_infer(args.address, args.model, args.causal)
    except (CheckFailed, grpc.RpcError, grpc.FutureTimeoutError, InferenceServerException) as exc:
        print(f"FAIL (gRPC): {exc}", file=sys.stderr)
        return 1
    print(f"  gRPC: health, reflection, metadata and one inference on {args.model} at {args.address}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
