"""Shared memory switched on with no key configured (POSENC_SHARED_MEMORY=true, no POSENC_RESTRICTED_API), against a
real `posenc serve` on loopback: over TCP nobody may use it (docs/inference.md, "Security: who may use shared
memory"; docs/grpc.md, "Restricted groups and shared memory"). Every shared-memory call is refused over gRPC
(PERMISSION_DENIED) and over HTTP (403), with or without a guessed header, while the rest of the service answers.
The other shared-memory tests all configure a key, so a server that let everyone in when none is configured would
pass them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from posenc.models.dtypes import lookup
from posenc.service.testing import SHARED_MEMORY_HEADERS, ServerProcess, without_posenc
from tests.onnx_models import random_inputs

MODEL = "rope_attention"
REFUSAL = ("shared memory over TCP needs the header of the 'shared-memory' group of POSENC_RESTRICTED_API (and the "
           "server has to be configured with one)")
# no header, and the header a client would guess from the documentation's examples
HEADERS: list[dict[str, str] | None] = [None, dict(SHARED_MEMORY_HEADERS)]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # without_posenc: a POSENC_RESTRICTED_API in the environment running the tests would configure a key
    settings = {"shared_memory": True, "log_level": "warning", "max_queue_delay_us": 0}
    with ServerProcess(settings, base_env=without_posenc(), grpc=True) as process:
        yield process


@pytest.fixture
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_address)
    yield client
    client.close()


@pytest.fixture
def http_client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.address)
    yield client
    client.close()


@pytest.fixture
def shared_object() -> Iterator[tuple[str, int]]:
    """A real 4096-byte POSIX shared-memory object (made without multiprocessing's resource tracker): its key and
    size. It exists, so a refusal is the caller's, not a missing object's."""
    name = f"posenc_nokey_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        yield f"/{name}", 4096
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{name}")


def _refused(call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as refused:
        call(*args, **kwargs)
    return str(refused.value.status()), str(refused.value.message())


def _grpc_inputs(inputs: dict[str, np.ndarray], region: str | None = None) -> list[grpcclient.InferInput]:
    """The arrays in the request, or (`region`) named in it, laid out back to back in that region."""
    tensors, offset = [], 0
    for name, array in inputs.items():
        tensor = grpcclient.InferInput(name, list(array.shape), lookup(array.dtype).kserve)
        if region is None:
            tensor.set_data_from_numpy(array)
        else:
            tensor.set_shared_memory(region, array.nbytes, offset=offset)
        tensors.append(tensor)
        offset += array.nbytes
    return tensors


def test_grpc_shared_memory_without_a_configured_key_is_permission_denied(
        grpc_client: grpcclient.InferenceServerClient, shared_object: tuple[str, int]) -> None:
    key, size = shared_object
    assert "system_shared_memory" in grpc_client.get_server_metadata().extensions  # on: refused, not off
    inputs = random_inputs(8, 8, 64, 1, 2)
    calls = {
        "register": lambda h: grpc_client.register_system_shared_memory("stolen", key, size, headers=h),
        "status": lambda h: grpc_client.get_system_shared_memory_status(headers=h),
        "unregister": lambda h: grpc_client.unregister_system_shared_memory(headers=h),
        "infer": lambda h: grpc_client.infer(MODEL, _grpc_inputs(inputs, region="stolen"), headers=h),
    }
    for headers in HEADERS:
        for what, call in calls.items():
            status, message = _refused(call, None if headers is None else dict(headers))
            assert status == "StatusCode.PERMISSION_DENIED", (what, headers, status, message)
            assert REFUSAL in message, (what, message)
    # the rest of the service answers the same client
    assert grpc_client.infer(MODEL, _grpc_inputs(inputs)).as_numpy("output").shape == inputs["query"].shape


def test_http_shared_memory_without_a_configured_key_is_403(
        http_client: httpclient.InferenceServerClient, shared_object: tuple[str, int]) -> None:
    """The same server's HTTP routes: a 403 with the same words."""
    key, size = shared_object
    assert "system_shared_memory" in http_client.get_server_metadata()["extensions"]
    for headers in HEADERS:
        for call, args in ((http_client.register_system_shared_memory, ("stolen", key, size)),
                           (http_client.get_system_shared_memory_status, ()),
                           (http_client.unregister_system_shared_memory, ())):
            status, message = _refused(call, *args, headers=None if headers is None else dict(headers))
            assert status == "403" and REFUSAL in message, (call.__name__, headers, status, message)
    assert http_client.is_server_live()
