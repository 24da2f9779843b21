"""Shared memory on a CUDA server: mapped regions pinned for the device while registered, and a region a request
still runs on unpinned and unmapped only once that request is over (its lease), over HTTP and gRPC alike.

The pinning itself is a fake here (`Pins` records what would be page-locked); the real `cudaHostRegister` runs in
the CUDA tests at the end, which skip cleanly without onnxruntime-gpu and a device."""

from __future__ import annotations

import asyncio
import json
import mmap
import os
from collections.abc import Coroutine, Iterator
from typing import Any

import numpy as np
import pytest

import posenc.service.inference.runtime.engine as engine_module
from posenc.service.budget import MemoryBudget
from posenc.service.errors import BadRequest
from posenc.service.grpc.servicer import Servicer
from posenc.service.inference.dataplane import DataPlane
from posenc.service.inference.runtime.devices import HostPinning
from posenc.service.inference.runtime.engine import Engine, run_model
from posenc.service.inference.runtime.repository import CUDA, LoadedModel
from posenc.service.inference.shared_memory.refs import ShmRef
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.settings import Settings
from posenc.service.testing import (
    KServeRequest,
    RequestedOutput,
    SharedMemory,
    SharedMemoryInput,
    kserve_request,
    memfd_key,
    sealed_memfd,
)
from tests.conftest import SELF_PEER, TRUSTED, peer_sending, running_client, shared_memory_client
from tests.inference.test_engine import require_cuda_device
from tests.onnx_models import REPOSITORY, grpc_infer_request, random_inputs, run, session

MODEL = "rope_attention"
SHAPE = (1, 8, 2, 64)  # rope_attention's query, key, value and output at B=1 S=2: 4096 bytes each
TENSOR_BYTES = 4096


class Pins:
    """A stand-in for `HostPinning`: what is pinned now, and every pin and unpin in order, with whether the
    region's mapping was still open at that moment."""

    def __init__(self, registry: SharedMemoryRegistry | None = None, refuse: bool = False) -> None:
        self.registry, self.refuse = registry, refuse
        self.pinned: dict[int, tuple[int, bool]] = {}  # address -> (bytes, read-only)
        self.events: list[tuple[str, int]] = []

    def pin(self, address: int, size: int, read_only: bool) -> bool:
        self.events.append(("pin", address))
        if self.refuse:
            return False
        self.pinned[address] = (size, read_only)
        return True

    def unpin(self, address: int) -> None:
        assert self.registry is None or all(  # unpinned while still mapped
            not region.closed for region in [*self.registry._regions.values(), *self.registry._retired])
        self.events.append(("unpin", address))
        del self.pinned[address]


def _pinning_registry(refuse: bool = False) -> tuple[SharedMemoryRegistry, Pins]:
    registry = SharedMemoryRegistry(enabled=True)
    pins = Pins(registry, refuse)
    registry.pinning = pins  # type: ignore[assignment]
    return registry, pins


@pytest.fixture
def memfd() -> Iterator[tuple[str, int]]:
    fd = sealed_memfd(4 * TENSOR_BYTES)
    yield memfd_key(fd), fd
    os.close(fd)


def _address(registry: SharedMemoryRegistry, name: str) -> int:
    mapping = registry._regions[SELF_PEER.owner, name].mapping
    assert mapping is not None
    view = np.frombuffer(mapping, np.uint8)
    address = view.ctypes.data
    del view
    return address


def test_a_mapped_region_is_pinned_while_registered(memfd: tuple[str, int]) -> None:
    key, fd = memfd
    registry, pins = _pinning_registry()
    registry.register("r", key, 4100, 2 * TENSOR_BYTES, caller=peer_sending(fd))
    address = _address(registry, "r")  # the mapping starts at the granule below the region's offset
    assert pins.pinned == {address: (4100 % mmap.ALLOCATIONGRANULARITY + 2 * TENSOR_BYTES, False)}  # whole, writable
    assert registry._regions[SELF_PEER.owner, "r"].unpin is not None
    registry.unregister(SELF_PEER, "r")
    assert pins.events == [("pin", address), ("unpin", address)] and pins.pinned == {}
    assert registry._retired == []
    registry.close()


def test_a_copied_region_is_not_pinned_and_a_refusal_leaves_it_pageable(memfd: tuple[str, int]) -> None:
    registry, pins = _pinning_registry()
    object_key = f"posenc_pin_{os.getpid()}"
    fd = os.open(f"/dev/shm/{object_key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, TENSOR_BYTES)
        registry.register("copied", object_key, 0, TENSOR_BYTES, TRUSTED)  # may shrink: read and written, not mapped
        assert pins.events == []
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm/{object_key}")
    refusing, refused = _pinning_registry(refuse=True)
    key, memfd_fd = memfd
    refusing.register("r", key, 0, TENSOR_BYTES, caller=peer_sending(memfd_fd))
    region = refusing._regions[SELF_PEER.owner, "r"]
    assert len(refused.events) == 1 and region.unpin is None and region.mapping is not None
    refusing.unregister(SELF_PEER, "r")
    assert refused.events[1:] == [] and refusing._retired == []  # nothing to unpin; unmapped
    registry.close()
    refusing.close()


def test_a_region_a_request_holds_is_unpinned_only_when_its_run_is_over(memfd: tuple[str, int]) -> None:
    key, fd = memfd
    registry, pins = _pinning_registry()
    registry.register("r", key, 0, 2 * TENSOR_BYTES, caller=peer_sending(fd))
    address = _address(registry, "r")
    regions = registry.for_caller(SELF_PEER)
    view = regions.input_array(ShmRef("r", 0, 16), np.dtype(np.float32), (4,), "input 'x'")
    del view  # no view left: only the lease keeps the region
    with pytest.raises(BadRequest, match="past the end of region 'r'"):  # a refused read holds no extra lease
        regions.input_array(ShmRef("r", 2 * TENSOR_BYTES, 16), np.dtype(np.float32), (4,), "input 'y'")
    registry.unregister(SELF_PEER, "r")  # while the request runs (say): the device may still copy from it
    assert pins.pinned and len(registry._retired) == 1 and not registry._retired[0].closed
    regions.release()
    assert pins.events == [("pin", address), ("unpin", address)] and registry._retired == []
    regions.release()  # twice is harmless
    registry.close()


def test_a_region_still_viewed_after_its_request_is_unpinned_once(memfd: tuple[str, int]) -> None:
    key, fd = memfd
    registry, pins = _pinning_registry()
    registry.register("r", key, 0, 2 * TENSOR_BYTES, caller=peer_sending(fd))
    region = registry._regions[SELF_PEER.owner, "r"]
    address = _address(registry, "r")
    regions = registry.for_caller(SELF_PEER)
    view = regions.input_array(ShmRef("r", 0, 16), np.dtype(np.float32), (4,), "input 'x'")
    regions.release()
    regions.release()  # a second release takes nothing more
    assert region.leases == 0
    registry.unregister(SELF_PEER, "r")  # no run copies from it: unpinned, but the view keeps it mapped
    assert pins.events == [("pin", address), ("unpin", address)] and registry._retired == [region]
    del view
    registry.unregister(SELF_PEER)  # the next sweep unmaps it, without unpinning it again
    assert pins.events == [("pin", address), ("unpin", address)] and registry._retired == [] and region.closed
    registry.close()


@pytest.mark.parametrize(("on_cuda", "pin_setting", "pinned"), [(False, True, False), (True, False, False),
                                                                 (True, True, True)])
def test_the_server_pins_only_when_a_model_runs_on_cuda_and_the_setting_allows(
        monkeypatch: pytest.MonkeyPatch, on_cuda: bool, pin_setting: bool, pinned: bool) -> None:
    pinning = Pins()
    monkeypatch.setattr(HostPinning, "open", classmethod(lambda cls: pinning))
    monkeypatch.setattr(Engine, "on_cuda", property(lambda self: on_cuda))
    with running_client(shared_memory=True, cuda_pin_shared_memory=pin_setting) as client:
        assert client.app.state.process.shared_memory.pinning is (pinning if pinned else None)  # type: ignore[attr-defined]


def test_a_cuda_run_binds_the_output_arrays_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the output goes straight into the array given (onnxruntime copies it there from the device), not
    through a host array of onnxruntime's first. Run here on a CPU session labelled CUDA: the path taken is the
    same."""
    engine = Engine(Settings(model_repository=str(REPOSITORY), intra_op_num_threads=1))
    assert engine.load() == []
    loaded = engine.models[MODEL]
    assert isinstance(loaded, LoadedModel)
    on_cuda = LoadedModel(loaded.name, loaded.config, loaded.session, [CUDA, *loaded.providers])

    def copied(*args: object) -> None:
        raise AssertionError("the output came back through a host array of onnxruntime's own")

    monkeypatch.setattr(engine_module, "_run_bound", copied)
    arrays = random_inputs(8, 8, 64, 1, 2)
    out = np.empty(SHAPE, np.float32)
    assert run_model(on_cuda, arrays, {"output": out})["output"] is out
    np.testing.assert_allclose(out, run(session(REPOSITORY / MODEL / "model.onnx"), arrays), atol=1e-5, rtol=1e-5)
    asyncio.run(engine.close())


def test_an_http_request_releases_its_regions_whether_it_succeeds_or_fails(memfd: tuple[str, int]) -> None:
    key, fd = memfd
    arrays = random_inputs(8, 8, 64, 1, 2)
    os.pwrite(fd, arrays["query"].tobytes(), 0)
    inputs = {**arrays, "query": SharedMemoryInput(np.dtype(np.float32), SHAPE, SharedMemory("r", TENSOR_BYTES, 0))}

    def request(output_bytes: int) -> KServeRequest:
        output = RequestedOutput("output", shared_memory=SharedMemory("r", output_bytes, TENSOR_BYTES))
        return kserve_request(inputs, outputs=[output])

    with shared_memory_client(peer=peer_sending(fd)) as client:
        registry: SharedMemoryRegistry = client.app.state.process.shared_memory  # type: ignore[attr-defined]
        register = {"key": key, "offset": 0, "byte_size": 2 * TENSOR_BYTES}
        assert client.post("/v2/systemsharedmemory/region/r/register", content=json.dumps(register)).status_code == 200
        region = registry._regions[SELF_PEER.owner, "r"]
        fits = request(TENSOR_BYTES)
        ok = client.post(f"/v2/models/{MODEL}/infer", content=fits.body, headers=fits.headers)
        assert ok.status_code == 200, ok.text
        assert region.leases == 0
        too_small = request(16)
        refused = client.post(f"/v2/models/{MODEL}/infer", content=too_small.body, headers=too_small.headers)
        assert refused.status_code == 400 and "shared_memory_byte_size is 16 bytes" in refused.text
        assert region.leases == 0


def test_a_grpc_request_releases_its_regions_whether_it_succeeds_or_fails(memfd: tuple[str, int]) -> None:
    key, fd = memfd
    engine = Engine(Settings(model_repository=str(REPOSITORY), intra_op_num_threads=1))
    assert engine.load() == []
    registry = SharedMemoryRegistry(enabled=True)
    caller = peer_sending(fd)
    registry.register("r", key, 0, 2 * TENSOR_BYTES, caller=caller)
    region = registry._regions[SELF_PEER.owner, "r"]
    plane = DataPlane(engine, engine.settings, MemoryBudget(1 << 30, max_waiters=8, wait_seconds=None), registry,
                      problems=[])
    servicer = Servicer(plane, lambda *args: None)
    arrays = random_inputs(8, 8, 64, 1, 2)
    os.pwrite(fd, arrays["query"].tobytes(), 0)

    def infer(output_bytes: int) -> Coroutine[Any, Any, bytes]:
        message = grpc_infer_request({name: array for name, array in arrays.items() if name != "query"}, MODEL)
        tensor = message.inputs.add(name="query", datatype="FP32", shape=SHAPE)
        tensor.parameters["shared_memory_region"].string_param = "r"
        tensor.parameters["shared_memory_byte_size"].int64_param = TENSOR_BYTES
        out = message.outputs.add(name="output")
        out.parameters["shared_memory_region"].string_param = "r"
        out.parameters["shared_memory_byte_size"].int64_param = output_bytes
        out.parameters["shared_memory_offset"].int64_param = TENSOR_BYTES
        size = message.ByteSize()
        raw = [memoryview(chunk) for chunk in message.raw_input_contents]
        del message.raw_input_contents[:]  # as the servicer gets it: the raw entries apart
        return servicer.infer(message, raw, caller, size)

    async def scenario() -> None:
        await infer(TENSOR_BYTES)
        assert region.leases == 0
        with pytest.raises(BadRequest, match="shared_memory_byte_size is 16 bytes"):
            await infer(16)
        assert region.leases == 0
        await engine.close()

    asyncio.run(scenario())
    expected = run(session(REPOSITORY / MODEL / "model.onnx"), arrays)
    np.testing.assert_allclose(np.frombuffer(os.pread(fd, TENSOR_BYTES, TENSOR_BYTES), np.float32).reshape(SHAPE),
                               expected, atol=1e-5, rtol=1e-5)
    registry.close()


# --- on a CUDA device (skip without one) -------------------------------------------------------------------------


def test_on_cuda_a_mapped_region_is_pinned_and_the_output_is_copied_into_it(memfd: tuple[str, int]) -> None:
    """The real cudaHostRegister on a sealed memfd's mapping, and a CUDA run writing its output into a host array
    given as `out` (bound as onnxruntime's output buffer: the array itself comes back)."""
    require_cuda_device()
    key, fd = memfd
    registry = SharedMemoryRegistry(enabled=True)
    registry.pinning = HostPinning.open()
    assert registry.pinning is not None
    registry.register("r", key, 0, 4 * TENSOR_BYTES, caller=peer_sending(fd))
    region = registry._regions[SELF_PEER.owner, "r"]
    assert region.unpin is not None, "cudaHostRegister refused the mapping"
    engine = Engine(Settings(model_repository=str(REPOSITORY), providers="cuda"))
    assert engine.load() == []
    model = engine.models[MODEL]
    assert isinstance(model, LoadedModel) and CUDA in model.providers
    arrays = random_inputs(8, 8, 64, 1, 2)
    regions = registry.for_caller(SELF_PEER)
    os.pwrite(fd, arrays["query"].tobytes(), 0)
    query = regions.input_array(ShmRef("r", 0, TENSOR_BYTES), np.dtype(np.float32), SHAPE, "input 'query'")
    out = regions.output_array(ShmRef("r", TENSOR_BYTES, TENSOR_BYTES), np.dtype(np.float32), SHAPE,
                               "output 'output'", [ShmRef("r", 0, TENSOR_BYTES)])
    assert out is not None
    result = run_model(model, {**arrays, "query": query}, {"output": out})
    assert result["output"] is out
    expected = run(session(REPOSITORY / MODEL / "model.onnx"), arrays)
    np.testing.assert_allclose(np.frombuffer(os.pread(fd, TENSOR_BYTES, TENSOR_BYTES), np.float32).reshape(SHAPE),
                               expected, atol=1e-5, rtol=1e-5)
    del query, out, result
    regions.release()
    registry.unregister(SELF_PEER, "r")
    assert registry._retired == []
    asyncio.run(engine.close())
