"""Shared memory switched off, the registry's checks, and the no-copy claims of the lean binary path:
inputs reach onnxruntime as views of the one body buffer or of the mapped region (a sealed memfd, registered
by a same-host peer)."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from starlette.requests import ClientDisconnect

import posenc.service.inference.runtime.engine as engine_module
from posenc.service.errors import BadRequest, ClientClosedRequest, PayloadTooLarge
from posenc.service.inference.codecs.kserve_request import parse_infer_request
from posenc.service.inference.runtime.engine import Engine
from posenc.service.inference.runtime.repository import LoadedModel
from posenc.service.inference.shared_memory.refs import ShmRef
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.request_kit.bodies import ALIGNMENT, read_aligned_body
from posenc.service.testing import (
    RequestedOutput,
    SharedMemory,
    kserve_request,
    memfd_key,
    sealed_memfd,
    shared_memory_inputs,
)
from tests.conftest import SELF_PEER, TRUSTED, peer_sending, running_client, shared_memory_client
from tests.onnx_models import REPOSITORY, random_inputs, run, session

URL = "/v2/models/rope_attention/infer"


def _shm_object(size: int) -> Iterator[tuple[str, int]]:
    """A POSIX shared-memory object of `size` bytes: (key, fd); unlinked afterwards."""
    key = f"posenc_unit_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm/{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
    yield key, fd
    os.close(fd)
    os.unlink(f"/dev/shm/{key}")


def _memfd(size: int) -> Iterator[tuple[str, int]]:
    """A sealed memfd of `size` bytes (mapped by the server: zero copy): (key, fd) for this process as a peer."""
    fd = sealed_memfd(size)
    yield memfd_key(fd), fd
    os.close(fd)


@pytest.fixture
def shm_object() -> Iterator[tuple[str, int]]:
    yield from _shm_object(8192)


@pytest.fixture
def memfd() -> Iterator[tuple[str, int]]:
    yield from _memfd(8192)


@pytest.fixture
def big_memfd() -> Iterator[tuple[str, int]]:
    yield from _memfd(32768)


@pytest.fixture
def big_object() -> Iterator[tuple[str, int]]:
    yield from _shm_object(32768)


def _binary_body(inputs: Mapping[str, np.ndarray], extra: Mapping[str, Any] | None = None) -> tuple[bytes, str]:
    request = kserve_request(inputs, extra=extra)
    return request.body, str(request.header_length)


def _root(array: np.ndarray) -> object:
    """The object at the end of an array's chain of bases (what owns the memory)."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _is_body_buffer(root: object) -> bool:
    """The one buffer a body is read into (bytes owned by a 1-D uint8 array), not a copy of a tensor."""
    return isinstance(root, np.ndarray) and root.base is None and root.dtype == np.uint8 and root.ndim == 1


# --- off by default ------------------------------------------------------------------------------------------


def test_off_by_default_every_route_says_how_to_enable() -> None:
    with running_client() as client:
        assert "system_shared_memory" not in client.get("/v2").json()["extensions"]
        answers = [client.get("/v2/systemsharedmemory/status"),
                   client.get("/v2/systemsharedmemory/region/r/status"),
                   client.post("/v2/systemsharedmemory/region/r/register",
                               content=json.dumps({"key": "/x", "offset": 0, "byte_size": 8})),
                   client.post("/v2/systemsharedmemory/region/r/unregister"),
                   client.post("/v2/systemsharedmemory/unregister")]
        for answer in answers:
            assert answer.status_code == 400 and "POSENC_SHARED_MEMORY=true" in answer.json()["error"]


@pytest.mark.parametrize("where", ["input", "output"])
def test_shared_memory_parameters_are_400_when_off(where: str) -> None:
    inputs = random_inputs(8, 8, 64, 1, 2)
    params = {"shared_memory_region": "r", "shared_memory_byte_size": 4096}
    if where == "input":
        body, length = _binary_body({k: v for k, v in inputs.items() if k != "query"})
        head = json.loads(body[:int(length)])
        head["inputs"].insert(0, {"name": "query", "datatype": "FP32", "shape": [1, 8, 2, 64], "parameters": params})
        new_head = json.dumps(head).encode()
        body, length = new_head + body[int(length):], str(len(new_head))
    else:
        body, length = _binary_body(inputs, {"outputs": [{"name": "output", "parameters": params}]})
    with running_client() as client:
        answer = client.post(URL, content=body, headers={"Inference-Header-Content-Length": length})
    assert answer.status_code == 400
    assert f"{where} '{'query' if where == 'input' else 'output'}'" in answer.json()["error"]
    assert "POSENC_SHARED_MEMORY=true" in answer.json()["error"]


# --- the lean binary path: one buffer, views into onnxruntime -------------------------------------------------


async def _chunks(parts: list[bytes], disconnect: bool = False) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if disconnect:
        raise ClientDisconnect


@pytest.mark.parametrize("align_at", [0, 1, 37, 473])
def test_aligned_body_puts_the_binary_section_on_a_boundary(align_at: int) -> None:
    data = bytes(range(256)) * 4
    body = asyncio.run(read_aligned_body(str(len(data)), _chunks([data[:100], data[100:]]), 4096, align_at))
    assert body == data and _is_body_buffer(body.obj)
    assert np.frombuffer(body, np.uint8)[align_at:].ctypes.data % ALIGNMENT == 0


def test_aligned_body_keeps_the_limits() -> None:
    with pytest.raises(PayloadTooLarge, match="7 bytes"):
        asyncio.run(read_aligned_body("7", _chunks([]), 6, 0))
    with pytest.raises(PayloadTooLarge, match="at least 8"):
        asyncio.run(read_aligned_body(None, _chunks([b"abcd", b"efgh", b"never read"]), 6, 0))
    with pytest.raises(BadRequest, match="Content-Length"):
        asyncio.run(read_aligned_body("lots", _chunks([]), 6, 0))
    with pytest.raises(PayloadTooLarge, match="at least 1000000000000000000 bytes"):
        asyncio.run(read_aligned_body("9" * 5000, _chunks([]), 6, 0))
    with pytest.raises(BadRequest, match="longer than its Content-Length"):
        asyncio.run(read_aligned_body("3", _chunks([b"ab", b"cd"]), 6, 0))
    with pytest.raises(BadRequest, match="ended after 2 of the 4"):
        asyncio.run(read_aligned_body("4", _chunks([b"ab"]), 6, 0))
    with pytest.raises(ClientClosedRequest, match="after 2 bytes"):
        asyncio.run(read_aligned_body("4", _chunks([b"ab"], disconnect=True), 6, 0))
    assert asyncio.run(read_aligned_body(None, _chunks([b"ab", b"cd"]), 6, 0)) == b"abcd"


def test_a_header_length_of_thousands_of_digits_is_a_400() -> None:
    with pytest.raises(BadRequest, match="is outside the body"):
        parse_infer_request(b'{"inputs": []}', "9" * 5000)


def test_binary_inputs_are_views_of_the_body_buffer() -> None:
    inputs = random_inputs(8, 8, 64, 1, 3)
    data, length = _binary_body(inputs)
    body = asyncio.run(read_aligned_body(str(len(data)), _chunks([data]), len(data), int(length)))
    parsed = parse_infer_request(body, length)
    for tensor in parsed.inputs:
        assert _root(tensor.array) is body.obj, f"{tensor.name} was copied"
        np.testing.assert_array_equal(tensor.array, inputs[tensor.name])


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    """The inputs the route hands to the engine (what onnxruntime receives for a request run on its own)."""
    seen: dict[str, np.ndarray] = {}
    original = Engine.infer

    async def spy(self: Engine, model: Any, inputs: Mapping[str, np.ndarray],
                  out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        seen.update(inputs)
        return await original(self, model, inputs, out)

    monkeypatch.setattr(Engine, "infer", spy)
    return seen


def test_the_route_hands_views_of_the_body_to_the_engine(captured: dict[str, np.ndarray]) -> None:
    inputs = random_inputs(8, 8, 64, 2, 5)
    body, length = _binary_body(inputs)
    with running_client() as client:
        answer = client.post(URL, content=body, headers={"Inference-Header-Content-Length": length})
    assert answer.status_code == 200
    assert int(answer.headers["content-length"]) == len(answer.content)
    for name in inputs:
        assert _is_body_buffer(_root(captured[name])), f"{name} was copied on its way to onnxruntime"


def test_shared_memory_inputs_reach_the_engine_as_views_of_the_mapping(
        captured: dict[str, np.ndarray], memfd: tuple[str, int]) -> None:
    key, fd = memfd
    query = random_inputs(8, 8, 64, 1, 2)["query"]  # 4096 bytes
    os.pwrite(fd, query.tobytes(), 128)
    rest = {k: v for k, v in random_inputs(8, 8, 64, 1, 2).items() if k != "query"}
    body, length = _binary_body(rest)
    head = json.loads(body[:int(length)])
    head["inputs"].insert(0, {"name": "query", "datatype": "FP32", "shape": [1, 8, 2, 64], "parameters": {
        "shared_memory_region": "q", "shared_memory_byte_size": 4096, "shared_memory_offset": 64}})
    new_head = json.dumps(head).encode()
    with shared_memory_client(peer=peer_sending(fd)) as client:
        assert "system_shared_memory" in client.get("/v2").json()["extensions"]
        register = {"key": key, "offset": 64, "byte_size": 8192 - 64}
        assert client.post("/v2/systemsharedmemory/region/q/register", content=json.dumps(register)).status_code == 200
        answer = client.post(URL, content=new_head + body[int(length):],
                             headers={"Inference-Header-Content-Length": str(len(new_head))})
        assert answer.status_code == 200, answer.text
        mapping = client.app.state.process.shared_memory._regions[SELF_PEER.owner, "q"].mapping  # type: ignore[attr-defined]
        assert _root(captured["query"]) is mapping, "the shared-memory input was copied"
        assert not captured["query"].flags.writeable
        np.testing.assert_array_equal(captured["query"], query)


# --- the registry on its own -----------------------------------------------------------------------------------


def test_registry_checks_every_range(memfd: tuple[str, int]) -> None:
    key, fd = memfd
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("r", key, 4100, 4092, caller=peer_sending(fd))  # an offset that is no multiple of the page size
    os.pwrite(fd, np.arange(4, dtype=np.float32).tobytes(), 4100 + 8)
    regions = registry.for_caller(SELF_PEER)
    view = regions.input_array(ShmRef("r", 8, 16), np.dtype(np.float32), (2, 2), "input 'x'")
    np.testing.assert_array_equal(view, np.arange(4, dtype=np.float32).reshape(2, 2))
    with pytest.raises(BadRequest, match="past the end of region 'r' \\(4092 bytes\\)"):
        regions.input_array(ShmRef("r", 4080, 16), np.dtype(np.float32), (4,), "input 'x'")
    regions.write_output(ShmRef("r", 32, 64), np.full(3, 7, np.int64), "output 'y'")
    assert np.frombuffer(os.pread(fd, 24, 4100 + 32), np.int64).tolist() == [7, 7, 7]
    with pytest.raises(BadRequest, match="shared_memory_byte_size is 16 bytes, the output \\[3\\] int64 needs 24"):
        regions.write_output(ShmRef("r", 32, 16), np.full(3, 7, np.int64), "output 'y'")
    registry.unregister(SELF_PEER, "r")  # the request still holds it: closed once its run is over
    assert len(registry._retired) == 1 and view[1, 1] == 3
    regions.release()  # the run is over, but the view above still exports the mapping: closed once it is gone
    assert len(registry._retired) == 1
    del view
    registry.unregister(SELF_PEER, "r")
    assert registry._retired == [] and registry.status(SELF_PEER) == []
    registry.close()


def test_registry_limits_the_number_of_regions(shm_object: tuple[str, int]) -> None:
    key, _ = shm_object
    registry = SharedMemoryRegistry(enabled=True, max_regions=2)
    registry.register("a", key, 0, 8, TRUSTED)
    registry.register("b", key, 8, 8, TRUSTED)
    with pytest.raises(BadRequest, match="2 shared-memory regions are registered"):
        registry.register("c", key, 16, 8, TRUSTED)
    registry.close()
    assert registry.status(TRUSTED) == []


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"key": "/k"}', "'key' and 'byte_size' are required"),
    (b'{"key": "/k", "byte_size": 0}', "'byte_size' must be an integer >= 1"),
    (b'{"key": "/k", "byte_size": 8, "offset": -1}', "'offset' must be an integer >= 0"),
    (b'{"key": "/k", "byte_size": true}', "'byte_size' must be an integer >= 1"),
    (b'{"key": 7, "byte_size": 8}', "'key' must be a string"),
    (b'{"key": "/k", "byte_size": 8, "path": "/etc"}', "unknown keys ['path']"),
])
def test_register_body_is_checked(body: bytes, message: str) -> None:
    with shared_memory_client() as client:
        answer = client.post("/v2/systemsharedmemory/region/r/register", content=body)
        assert answer.status_code == 400 and message in answer.json()["error"]
        assert client.get("/v2/systemsharedmemory/status").json() == []


def test_symbolic_links_and_folders_under_dev_shm_are_refused(tmp_path: Any) -> None:
    name = f"posenc_unit_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 4096)
    registry = SharedMemoryRegistry(enabled=True)
    try:
        os.symlink(target, f"/dev/shm/{name}_link")
        os.mkdir(f"/dev/shm/{name}_dir")
        with pytest.raises(BadRequest, match="it is a symbolic link"):
            registry.register("link", f"/{name}_link", 0, 16, TRUSTED)
        with pytest.raises(BadRequest, match=f"shared-memory object '/{name}_dir' is not a regular"):
            registry.register("dir", f"/{name}_dir", 0, 16, TRUSTED)
        with pytest.raises(BadRequest, match="printable characters"):
            registry.register("x" * 256, f"/{name}_dir", 0, 16, TRUSTED)
    finally:
        os.unlink(f"/dev/shm/{name}_link")
        os.rmdir(f"/dev/shm/{name}_dir")
    assert registry.status(TRUSTED) == []


def test_regions_are_unmapped_at_shutdown(memfd: tuple[str, int]) -> None:
    key, fd = memfd
    with shared_memory_client(peer=peer_sending(fd)) as client:
        register = {"key": key, "offset": 0, "byte_size": 8192}
        assert client.post("/v2/systemsharedmemory/region/r/register", content=json.dumps(register)).status_code == 200
        region = client.app.state.process.shared_memory._regions[SELF_PEER.owner, "r"]  # type: ignore[attr-defined]
        assert client.get("/v2/systemsharedmemory/region/r/status").json() == [{"name": "r", **register}]
    assert region.closed and region.mapping.closed


# --- outputs written in place ----------------------------------------------------------------------------------


def test_output_views_only_where_the_model_can_write_directly(memfd: tuple[str, int]) -> None:
    key, fd = memfd
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("a", key, 0, 4096, peer_sending(fd))
    registry.register("b", key, 4096, 4096, peer_sending(fd))
    registry.register("c", key, 2048, 4096, peer_sending(fd))  # the same object: its bytes 2048..6143 alias "a" and "b"
    regions = registry.for_caller(SELF_PEER)
    f32 = np.dtype(np.float32)
    view = regions.output_array(ShmRef("b", 0, 4096), f32, (2, 512), "output 'y'", [ShmRef("a", 0, 4096)])
    assert view is not None and view.flags.writeable and view.shape == (2, 512)
    view[:] = 3
    assert regions.input_array(ShmRef("b", 0, 16), f32, (4,), "x").tolist() == [3.0] * 4
    del view
    overlapping = [ShmRef("b", 1024, 1024), ShmRef("c", 2048, 64)]  # c at 2048 = object byte 4096 = b's first
    for other in overlapping:
        assert regions.output_array(ShmRef("b", 0, 4096), f32, (1024,), "output 'y'", [other]) is None
    assert regions.output_array(ShmRef("b", 2, 4094), f32, (8,), "output 'y'", []) is None  # misaligned
    with pytest.raises(BadRequest, match="shared_memory_byte_size is 64 bytes, the output \\[32\\] float32 needs 128"):
        regions.output_array(ShmRef("b", 0, 64), f32, (32,), "output 'y'", [])
    registry.close()


def _shm_request(client: Any, key: str, inputs: Mapping[str, np.ndarray], out_offset: int) -> Any:
    """Register the whole object as region 'r', with `inputs` back to back from its start and the output at
    `out_offset`."""
    register = {"key": key if key.startswith("fd:") else f"/{key}", "offset": 0, "byte_size": 32768}
    assert client.post("/v2/systemsharedmemory/region/r/register", content=json.dumps(register)).status_code == 200
    output = RequestedOutput("output", shared_memory=SharedMemory("r", inputs["query"].nbytes, out_offset))
    return client.post(URL, content=kserve_request(shared_memory_inputs(inputs, "r"), outputs=[output]).body)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[Mapping[str, np.ndarray] | None]:
    """The `out` arrays of every model run (None: the run allocated its outputs)."""
    seen: list[Mapping[str, np.ndarray] | None] = []
    original = engine_module.run_model

    def spy(model: LoadedModel, inputs: Mapping[str, np.ndarray],
            out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        seen.append(out)
        return original(model, inputs, out)

    monkeypatch.setattr(engine_module, "run_model", spy)
    return seen


@pytest.mark.parametrize(("out_offset", "in_place"), [(16384, True), (0, False), (16386, False)])
def test_shared_memory_outputs_are_written_in_place_unless_they_overlap_an_input(
        big_memfd: tuple[str, int], runs: list[Any], out_offset: int, in_place: bool) -> None:
    """At 16384 the model writes into the mapping itself; over the inputs (0: over the query the run reads)
    or misaligned (16386) the output is copied in after the run; the answer is right every time."""
    key, fd = big_memfd
    inputs = random_inputs(8, 8, 64, 1, 2)  # 12,304 bytes; the output 4096
    os.pwrite(fd, b"".join(a.tobytes() for a in inputs.values()), 0)
    expected = run(session(REPOSITORY / "rope_attention" / "model.onnx"), inputs)
    with shared_memory_client(peer=peer_sending(fd)) as client:
        answer = _shm_request(client, key, inputs, out_offset)
        mapping = client.app.state.process.shared_memory._regions[SELF_PEER.owner, "r"].mapping  # type: ignore[attr-defined]
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["parameters"].get("shared_memory_offset", 0) == out_offset
        assert (runs[-1] is not None and _root(runs[-1]["output"]) is mapping) == in_place
    got = np.frombuffer(os.pread(fd, 4096, out_offset), np.float32).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


def test_an_output_region_too_small_is_a_400_before_anything_runs(big_object: tuple[str, int],
                                                                  runs: list[Any]) -> None:
    key, _ = big_object
    inputs = random_inputs(8, 8, 64, 1, 2)
    with shared_memory_client() as client:
        answer = _shm_request(client, key, inputs, 32768 - 2048)  # 2048 bytes left in the region
    assert answer.status_code == 400 and "past the end of region 'r'" in answer.json()["error"]
    assert runs == []
