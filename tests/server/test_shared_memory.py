"""System shared memory through tritonclient, unchanged but for the restricted-API header it passes on every
call (`headers=`), against a real uvicorn server on loopback: Triton's own example flow, and the bad inputs
(missing key, regions too small, unregistering, truncation)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from posenc.models.dtypes import lookup
from posenc.service.testing import SHARED_MEMORY_HEADERS, ServerProcess, shared_memory_key_settings
from tests.onnx_models import REPOSITORY, random_inputs, run, session, triton_inputs

MODEL = "rope_attention"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    settings = {"shared_memory": True, "max_queue_delay_us": 0, "log_level": "warning", **shared_memory_key_settings()}
    with ServerProcess(settings) as server:
        yield server.address


class WithHeaders:
    """A tritonclient client whose every call carries `headers` (tritonclient takes them per call, and writes
    into the dict it gets: each call gets a fresh copy)."""

    def __init__(self, client: httpclient.InferenceServerClient, headers: dict[str, str]) -> None:
        self.client, self.headers = client, headers

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        if name == "close":
            return method
        return lambda *args, **kwargs: method(*args, headers=dict(self.headers), **kwargs)


@pytest.fixture
def client(url: str) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(url)
    yield WithHeaders(client, SHARED_MEMORY_HEADERS)  # type: ignore[misc]
    client.unregister_system_shared_memory(headers=dict(SHARED_MEMORY_HEADERS))
    client.close()


def test_without_the_key_shared_memory_is_refused_over_tcp(url: str, raw_object: tuple[str, int]) -> None:
    """The probe's read: a client reaching the port registers another process's object. Refused with a 403
    that says what is needed (and never the key); the same with a wrong key."""
    plain = httpclient.InferenceServerClient(url)
    try:
        for headers in (None, {"posenc-shared-memory-key": "guess"}):
            status, message = _status_and_message(plain.register_system_shared_memory, "stolen", raw_object[0],
                                                  4096, headers=headers)
            assert status == "403" and "posenc-shared-memory-key" in message and "POSENC_RESTRICTED_API" in message
            assert "posenc-test-kit" not in message
        status, _ = _status_and_message(plain.get_system_shared_memory_status)
        assert status == "403"
        assert plain.is_server_live()
    finally:
        plain.close()


def _name(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def raw_object() -> Iterator[tuple[str, int]]:
    """A 4096-byte POSIX shared-memory object made without multiprocessing's resource tracker: (key, fd)."""
    key = _name("posenc_test")
    fd = os.open(f"/dev/shm/{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    yield f"/{key}", fd
    os.close(fd)
    os.unlink(f"/dev/shm/{key}")


def _expected(inputs: dict[str, np.ndarray]) -> np.ndarray:
    return run(session(REPOSITORY / MODEL / "model.onnx"), inputs)


def _shm_inputs(inputs: dict[str, np.ndarray], region: str) -> list[httpclient.InferInput]:
    """Inputs that point into `region`, laid out back to back in dict order."""
    tensors, offset = [], 0
    for name, array in inputs.items():
        tensor = httpclient.InferInput(name, list(array.shape), lookup(array.dtype).kserve)
        tensor.set_shared_memory(region, array.nbytes, offset=offset)
        tensors.append(tensor)
        offset += array.nbytes
    return tensors


def _shm_output(region: str, byte_size: int, offset: int = 0) -> httpclient.InferRequestedOutput:
    output = httpclient.InferRequestedOutput("output")
    output.set_shared_memory(region, byte_size, offset=offset)
    return output


def test_triton_example_flow(client: httpclient.InferenceServerClient) -> None:
    """tritonclient's simple_http_shm_client flow: results equal the binary path's, byte for byte."""
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]
    inputs = random_inputs(8, 8, 64, 2, 7, start=5)
    in_size = sum(array.nbytes for array in inputs.values())
    out_size = inputs["query"].nbytes
    in_key, out_key = _name("/posenc_in"), _name("/posenc_out")
    in_handle = shm.create_shared_memory_region("input_data", in_key, in_size)
    out_handle = shm.create_shared_memory_region("output_data", out_key, out_size + 64)
    try:
        shm.set_shared_memory_region(in_handle, list(inputs.values()))
        client.register_system_shared_memory("input_data", in_key, in_size)
        client.register_system_shared_memory("output_data", out_key, out_size + 64)
        status = client.get_system_shared_memory_status()
        assert sorted(status, key=lambda s: s["name"]) == [
            {"name": "input_data", "key": in_key, "offset": 0, "byte_size": in_size},
            {"name": "output_data", "key": out_key, "offset": 0, "byte_size": out_size + 64}]
        assert client.get_system_shared_memory_status("input_data") == [s for s in status if s["name"] == "input_data"]

        result = client.infer(MODEL, _shm_inputs(inputs, "input_data"), outputs=[_shm_output("output_data", out_size,
                                                                                            offset=64)])
        entry = result.get_output("output")
        assert entry["parameters"] == {"shared_memory_region": "output_data", "shared_memory_byte_size": out_size,
                                       "shared_memory_offset": 64}
        assert entry["shape"] == [2, 8, 7, 64] and entry["datatype"] == "FP32" and "data" not in entry
        got = shm.get_contents_as_numpy(out_handle, np.float32, entry["shape"], offset=64)
        binary = client.infer(MODEL, triton_inputs(inputs, True)).as_numpy("output")
        np.testing.assert_array_equal(got, binary)
        np.testing.assert_allclose(got, _expected(inputs), atol=1e-5, rtol=1e-5)

        # shared-memory inputs with a binary output, in the same request
        mixed = client.infer(MODEL, _shm_inputs(inputs, "input_data"),
                             outputs=[httpclient.InferRequestedOutput("output", binary_data=True)])
        np.testing.assert_array_equal(mixed.as_numpy("output"), binary)
        client.unregister_system_shared_memory("input_data")
        client.unregister_system_shared_memory("output_data")
        assert client.get_system_shared_memory_status() == []
    finally:
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)


def _status_and_message(call: object, *args: object, **kwargs: object) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    return str(info.value.status()), str(info.value.message())


def test_register_a_key_that_does_not_exist(client: httpclient.InferenceServerClient) -> None:
    status, message = _status_and_message(client.register_system_shared_memory, "r", _name("/no_such"), 64)
    assert status == "400" and "no shared-memory object" in message and "shm_open" in message
    assert client.get_system_shared_memory_status() == []


@pytest.mark.parametrize("key", ["../etc/passwd", "/dev/shm/x", "a/b", ".hidden", "/", "x" * 256, "with space"])
def test_keys_are_names_not_paths(client: httpclient.InferenceServerClient, key: str) -> None:
    status, message = _status_and_message(client.register_system_shared_memory, "r", key, 64)
    assert status == "400" and "not a shared-memory object name" in message


def test_region_past_the_end_of_the_object(client: httpclient.InferenceServerClient,
                                           raw_object: tuple[str, int]) -> None:
    key, _ = raw_object
    status, message = _status_and_message(client.register_system_shared_memory, "r", key, 4000, offset=100)
    assert status == "400" and "4100 bytes" in message and "has 4096" in message


def test_register_twice_is_400_and_unregister_is_idempotent(client: httpclient.InferenceServerClient,
                                                            raw_object: tuple[str, int]) -> None:
    key, _ = raw_object
    client.register_system_shared_memory("r", key, 4096)
    status, message = _status_and_message(client.register_system_shared_memory, "r", key, 1024)
    assert status == "400" and "already registered" in message
    client.unregister_system_shared_memory("r")
    client.unregister_system_shared_memory("r")  # Triton: unregistering an unknown name changes nothing
    status, message = _status_and_message(client.get_system_shared_memory_status, "r")
    assert status == "404" and "no shared-memory region named 'r'" in message


def test_region_too_small_for_the_tensor(client: httpclient.InferenceServerClient,
                                         raw_object: tuple[str, int]) -> None:
    key, _ = raw_object
    inputs = random_inputs(8, 8, 64, 1, 1)  # query, key, value 2048 bytes each: 6152 bytes in all
    client.register_system_shared_memory("small", key, 4096)
    status, message = _status_and_message(client.infer, MODEL, _shm_inputs(inputs, "small"))
    assert status == "400" and "input 'value'" in message and "past the end of region 'small' (4096 bytes)" in message


def test_declared_size_must_match_the_tensor(client: httpclient.InferenceServerClient,
                                             raw_object: tuple[str, int]) -> None:
    key, _ = raw_object
    client.register_system_shared_memory("r", key, 4096)
    tensor = httpclient.InferInput("query", [1, 8, 1, 64], "FP32")
    tensor.set_shared_memory("r", 1024)
    others = triton_inputs({k: v for k, v in random_inputs(8, 8, 64, 1, 1).items() if k != "query"}, True)
    status, message = _status_and_message(client.infer, MODEL, [tensor, *others])
    assert status == "400" and "shared_memory_byte_size is 1024 bytes" in message and "needs 2048" in message


def test_output_region_too_small(client: httpclient.InferenceServerClient, raw_object: tuple[str, int]) -> None:
    key, _ = raw_object
    client.register_system_shared_memory("out", key, 4096)
    inputs = random_inputs(8, 8, 64, 1, 3)  # output: 6144 bytes
    status, message = _status_and_message(client.infer, MODEL, triton_inputs(inputs, True),
                                          outputs=[_shm_output("out", 4096)])
    assert status == "400" and "output 'output'" in message and "needs 6144" in message
    status, message = _status_and_message(client.infer, MODEL, triton_inputs(inputs, True),
                                          outputs=[_shm_output("out", 6144, offset=8)])
    assert status == "400" and "past the end of region 'out'" in message


def test_region_unregistered_between_two_requests(client: httpclient.InferenceServerClient) -> None:
    inputs = random_inputs(8, 8, 64, 1, 4)
    key = _name("/posenc_between")
    handle = shm.create_shared_memory_region("between", key, sum(a.nbytes for a in inputs.values()))
    try:
        shm.set_shared_memory_region(handle, list(inputs.values()))
        client.register_system_shared_memory("between", key, sum(a.nbytes for a in inputs.values()))
        first = client.infer(MODEL, _shm_inputs(inputs, "between")).as_numpy("output")
        np.testing.assert_allclose(first, _expected(inputs), atol=1e-5, rtol=1e-5)
        client.unregister_system_shared_memory("between")
        status, message = _status_and_message(client.infer, MODEL, _shm_inputs(inputs, "between"))
        assert status == "400" and "no shared-memory region named 'between' is registered" in message
    finally:
        shm.destroy_shared_memory_region(handle)


def test_truncated_region_is_400_not_a_crash(client: httpclient.InferenceServerClient,
                                             raw_object: tuple[str, int]) -> None:
    key, fd = raw_object
    inputs = random_inputs(8, 8, 64, 1, 1)
    client.register_system_shared_memory("shrinking", key, 4096)
    os.ftruncate(fd, 1024)  # the client shrinks its object after registering it
    status, message = _status_and_message(client.infer, MODEL, triton_inputs(inputs, True),
                                          outputs=[_shm_output("shrinking", 2048)])
    assert status == "400" and "now has 1024 bytes, the region needs 4096" in message
    query = httpclient.InferInput("query", [1, 8, 1, 64], "FP32")
    query.set_shared_memory("shrinking", 2048)
    others = triton_inputs({k: v for k, v in inputs.items() if k != "query"}, True)
    status, message = _status_and_message(client.infer, MODEL, [query, *others])
    assert status == "400" and "input 'query'" in message and "now has 1024 bytes" in message
    assert client.is_server_live()
    os.ftruncate(fd, 4096)  # grown back: usable again
    client.infer(MODEL, triton_inputs(inputs, True), outputs=[_shm_output("shrinking", 2048)])
