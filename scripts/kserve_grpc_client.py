"""KServe's own gRPC client (`kserve.InferenceGRPCClient`) against a live posenc, with the HTTP clients' fixture case.

    POSENC_GRPC_ADDRESS=127.0.0.1:8001 POSENC_FIXTURES=fixtures.json \
        .venv-kserve/bin/python scripts/kserve_grpc_client.py

Runs in an environment of its own (scripts/kserve-grpc-client-test.sh makes it): kserve's generated messages
(grpc_predict_v2.proto, package `inference`) clash with tritonclient's in one interpreter. Prints one line per
check and `N passed, M failed`; the exit status is non-zero when a check failed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from collections.abc import Awaitable, Callable

import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest

DTYPES = {"float32": np.float32, "int64": np.int64}


def tensor(doc: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(doc["b64"]), DTYPES[doc["dtype"]]).reshape(doc["shape"])


async def main() -> int:
    with open(os.environ["POSENC_FIXTURES"]) as file:
        fixtures = json.load(file)["infer"]
    client = InferenceGRPCClient(os.environ["POSENC_GRPC_ADDRESS"], timeout=60)
    model = fixtures["model"]
    inputs = {name: tensor(doc) for name, doc in fixtures["inputs"].items()}
    expected = {name: tensor(doc) for name, doc in fixtures["outputs"].items()}

    def request(name: str) -> InferRequest:
        tensors = []
        for input_name, array in inputs.items():
            entry = InferInput(input_name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64")
            entry.set_data_from_numpy(array, binary_data=True)
            tensors.append(entry)
        return InferRequest(model_name=name, infer_inputs=tensors, request_id="kserve-grpc-client")

    async def health() -> None:
        assert await client.is_server_live() and await client.is_server_ready()
        assert await client.is_model_ready(model)

    async def infer() -> None:
        response = await client.infer(request(model))
        assert response.id == "kserve-grpc-client", response.id
        for name, want in expected.items():
            got = response.get_output_by_name(name).as_numpy()
            assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype)
            worst = float(np.abs(got - want).max())
            assert worst <= 1e-5, f"{name}: max abs difference {worst}"

    async def unknown_model() -> None:
        try:
            await client.infer(request("no_such_model"))
        except Exception as exc:  # kserve raises grpc's AioRpcError
            assert "NOT_FOUND" in str(exc) and "unknown model 'no_such_model'" in str(exc), str(exc)
        else:
            raise AssertionError("an unknown model was answered")

    checks: dict[str, Callable[[], Awaitable[None]]] = {"health": health, "infer": infer,
                                                        "unknown model": unknown_model}
    passed = failed = 0
    for name, check in checks.items():
        try:
            await check()
            print(f"--- PASS: {name}")
            passed += 1
        except Exception as exc:
            print(f"--- FAIL: {name}: {exc!r}")
            failed += 1
    await client.close()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
