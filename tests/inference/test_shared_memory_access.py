"""Who may use shared memory, and what a register can cost: the restricted-API key over TCP, a Unix-socket
peer's own rights over each object, one descriptor per region, a bound on the bytes registered, and objects
that shrink under the server (copied, never mapped: a 400, never a SIGBUS)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from posenc.service.errors import BadRequest, Forbidden, PayloadTooLarge
from posenc.service.inference.shared_memory.guard import may_access
from posenc.service.inference.shared_memory.refs import ShmRef
from posenc.service.inference.shared_memory.registry import Region, SharedMemoryRegistry, shm_file
from posenc.service.request_kit.restricted import GROUP_ROUTES, SharedMemoryCaller, group_of
from posenc.service.request_kit.unix import Peer
from posenc.service.settings import Settings
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

NOBODY = SharedMemoryCaller(Peer(os.getpid(), 65534, frozenset({65534})), has_key=False)
REGISTER = "/v2/systemsharedmemory/region/{}/register"
URL = "/v2/models/rope_attention/infer"


@pytest.fixture
def shm_path() -> Iterator[Path]:
    """A /dev/shm object of 8192 zero bytes, owned by root, mode 0600 (as the probe's secret)."""
    path = Path(f"/dev/shm/posenc_access_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 8192)
    os.close(fd)
    yield path
    path.unlink(missing_ok=True)


def _register(client: object, name: str, key: str, size: int = 8192) -> object:
    return client.post(REGISTER.format(name), content=json.dumps({"key": key, "byte_size": size}))  # type: ignore[attr-defined]


# --- over TCP ---------------------------------------------------------------------------------------------------


def test_over_tcp_without_a_configured_key_nobody_may_use_shared_memory(shm_path: Path) -> None:
    with running_client(shared_memory=True) as client:
        for answer in (_register(client, "r", f"/{shm_path.name}"), client.get("/v2/systemsharedmemory/status")):
            assert answer.status_code == 403
            error = answer.json()["error"]
            assert "POSENC_RESTRICTED_API" in error and "POSENC_UDS" in error
        inputs = random_inputs(1, 8, 64, 1, 1)
        answer = client.post(URL, content=kserve_request(shared_memory_inputs(inputs, "r")).body)
        assert answer.status_code == 403 and "shared memory over TCP" in answer.json()["error"]


@pytest.mark.parametrize("headers", [{}, {"posenc-shared-memory-key": "wrong"}, {"x-other": "posenc-test-kit"}])
def test_the_key_is_required_and_never_echoed(shm_path: Path, headers: dict[str, str]) -> None:
    with shared_memory_client() as client:
        client.headers.pop("posenc-shared-memory-key")
        answer = client.post(REGISTER.format("r"), headers=headers,
                             content=json.dumps({"key": f"/{shm_path.name}", "byte_size": 8192}))
        assert answer.status_code == 403 and answer.json()["type"] == "forbidden"
        assert "posenc-shared-memory-key" in answer.json()["error"] and "posenc-test-kit" not in answer.text
        assert client.get("/v2/health/live").status_code == 200  # an unrestricted group


def test_other_groups_restricted_the_same_way() -> None:
    with running_client(restricted_api="model-repository,statistics:x-admin=s3cret") as client:
        assert client.post("/v2/repository/index", content=b"{}").status_code == 403
        assert client.post("/v2/repository/index", content=b"{}", headers={"x-admin": "s3cret"}).status_code == 200
        assert client.get("/v2/models/rope_attention/stats").status_code == 403
        assert client.get("/v2/models/rope_attention").status_code == 200  # metadata: not restricted


@pytest.mark.parametrize(("value", "message"), [
    ("shared-memory", "GROUP[,GROUP...]:HEADER=VALUE"),
    ("shared-memory:key", "GROUP[,GROUP...]:HEADER=VALUE"),
    ("shared-memory:bad header=SECRET", "GROUP[,GROUP...]:HEADER=VALUE"),
    ("sharedmemory:k=SECRET", "unknown protocol group 'sharedmemory'"),
    ("shared-memory:a=SECRET;shared-memory:b=SECRET", "restricted twice"),
])
def test_restricted_api_syntax_is_checked_at_start_up(value: str, message: str) -> None:
    with pytest.raises(ValidationError) as error:
        Settings(restricted_api=value)  # type: ignore[arg-type]
    assert message in str(error.value) and "SECRET" not in str(error.value)


def test_several_groups_and_specs_parse() -> None:
    settings = Settings(restricted_api="shared-memory,inference:X-Key=a=b; model-repository:x-admin=c")  # type: ignore[arg-type]
    assert settings.restrictions() == {"shared-memory": ("x-key", "a=b"), "inference": ("x-key", "a=b"),
                                       "model-repository": ("x-admin", "c")}


@pytest.mark.parametrize(("path", "group"), [
    ("/v2", "metadata"), ("/v2/models/m", "metadata"), ("/v2/models/m/versions/1", "metadata"),
    ("/v2/health/ready", "health"), ("/v2/models/m/ready", "health"), ("/v2/models/m/infer", "inference"),
    ("/v2/models/m/versions/1/infer", "inference"), ("/v2/models/m/config", "model-config"),
    ("/v2/models/m/stats", "statistics"), ("/v2/repository/index", "model-repository"),
    ("/v2/systemsharedmemory/status", "shared-memory"), ("/v2/systemsharedmemory/region/r/register", "shared-memory"),
    ("/v2/models/m/check", "inference"), ("/v2/models/m/versions/1/check", "inference"), ("/v1/rope", None),
    ("/metrics", None),
])
def test_every_protocol_route_has_its_group(path: str, group: str | None) -> None:
    assert group_of(path) == group
    assert set(GROUP_ROUTES) == set(Settings.model_fields["restricted_api"].description.split("groups: ")[1]
                                    .split(")")[0].split(", "))


# --- over the Unix socket: the peer's own rights -------------------------------------------------------------------


def _stat(uid: int, gid: int, mode: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


@pytest.mark.parametrize(("uid", "gid", "mode", "read", "write"), [
    (1000, 1000, 0o600, True, True), (1000, 1000, 0o400, True, False), (1000, 1000, 0o060, False, False),
    (0, 1000, 0o040, True, False), (0, 1000, 0o060, True, True), (0, 0, 0o600, False, False),
    (0, 0, 0o604, True, False), (0, 0, 0o666, True, True), (0, 2000, 0o006, True, True),
])
def test_access_is_judged_as_the_kernel_would(uid: int, gid: int, mode: int, read: bool, write: bool) -> None:
    peer = Peer(1, 1000, frozenset({1000}))  # owner bits for its own uid, group bits for its groups, else other
    assert may_access(peer, _stat(uid, gid, mode), write=False) == read
    assert may_access(peer, _stat(uid, gid, mode), write=True) == write
    assert may_access(Peer(1, 0, frozenset({0})), _stat(5, 5, 0), write=True)  # root may do anything


def test_a_peer_may_not_register_what_it_could_not_open(shm_path: Path) -> None:
    """The probe's read and write, as uid 65534 on the socket: a root object of mode 0600 is refused; 0644 is
    registered read-only (inputs yes, outputs 403); once it is the peer's own, outputs may go there too."""
    registry = SharedMemoryRegistry(enabled=True)
    key = f"/{shm_path.name}"
    with pytest.raises(Forbidden, match=r"uid 65534 .* may not read shared-memory object"):
        registry.register("secret", key, 0, 8192, NOBODY)
    os.chmod(shm_path, 0o644)
    registry.register("readable", key, 0, 8192, NOBODY)
    regions = registry.for_caller(NOBODY)
    assert regions.input_array(ShmRef("readable", 0, 16), np.dtype(np.float32), (4,), "x").tolist() == [0.0] * 4
    with pytest.raises(Forbidden, match="registered read-only"):
        regions.write_output(ShmRef("readable", 0, 16), np.ones(4, np.float32), "output 'y'")
    os.chown(shm_path, 65534, 65534)
    os.chmod(shm_path, 0o600)
    registry.register("own", key, 0, 8192, NOBODY)
    regions.write_output(ShmRef("own", 0, 16), np.ones(4, np.float32), "output 'y'")
    assert np.frombuffer(shm_path.read_bytes()[:16], np.float32).tolist() == [1.0] * 4
    # a region registered by a trusted caller is no way around it: another owner's names are not the peer's
    os.chown(shm_path, 0, 0)
    registry.register("by-key", key, 0, 8192, TRUSTED)
    with pytest.raises(BadRequest, match="no shared-memory region named 'by-key' is registered"):
        regions.input_array(ShmRef("by-key", 0, 16), np.dtype(np.float32), (4,), "x")
    registry.close()


def test_a_descriptor_key_is_for_peers_only() -> None:
    fd = sealed_memfd(4096)
    try:
        registry = SharedMemoryRegistry(enabled=True)
        with pytest.raises(BadRequest, match="only over the Unix socket"):
            registry.register("m", memfd_key(fd), 0, 4096, TRUSTED)
        with pytest.raises(BadRequest, match="must be followed by a descriptor number"):
            registry.register("m", "fd:x", 0, 4096, peer_sending(fd))
        with pytest.raises(BadRequest, match="no descriptor came with the request"):
            registry.register("m", memfd_key(fd), 0, 4096, SELF_PEER)
        registry.register("m", memfd_key(fd), 0, 4096, peer_sending(fd))
        assert registry._regions[SELF_PEER.owner, "m"].mapping is not None  # sealed against shrinking: mapped
        registry.close()
    finally:
        os.close(fd)


def test_a_descriptor_sent_read_only_registers_a_region_for_inputs_only() -> None:
    """The server keeps the access a descriptor was sent with: a memfd sent read-only is a region inputs may read
    and no output may be written to (400 naming why), whatever the object itself allows."""
    fd = os.memfd_create("posenc-read-only", os.MFD_CLOEXEC)
    os.pwrite(fd, np.arange(4, dtype=np.float32).tobytes(), 0)
    os.ftruncate(fd, 4096)
    read_only = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        registry = SharedMemoryRegistry(enabled=True)
        registry.register("ro", memfd_key(read_only), 0, 4096, peer_sending(read_only))
        regions = registry.for_caller(SELF_PEER)
        assert regions.input_array(ShmRef("ro", 0, 16), np.dtype(np.float32), (4,), "x").tolist() == [0, 1, 2, 3]
        with pytest.raises(BadRequest, match=r"region 'ro' was registered read-only \(its descriptor is open "
                                             r"read-only\)"):
            regions.write_output(ShmRef("ro", 0, 16), np.ones(4, np.float32), "output 'y'")
        registry.close()
        assert os.pread(fd, 16, 0) == np.arange(4, dtype=np.float32).tobytes()
    finally:
        os.close(read_only)
        os.close(fd)


# --- what a register costs ------------------------------------------------------------------------------------------


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_one_descriptor_per_copied_region_two_per_mapped_one(shm_path: Path) -> None:
    """A mapped region keeps its descriptor beside the mapping's: its seals are read before every write."""
    fd = sealed_memfd(8192)
    registry = SharedMemoryRegistry(enabled=True)
    try:
        before = _open_descriptors()
        for index in range(8):
            registry.register(f"copied{index}", f"/{shm_path.name}", 0, 8192, TRUSTED)
            registry.register(f"mapped{index}", memfd_key(fd), 0, 8192, peer_sending(fd))
        assert _open_descriptors() - before == 8 + 2 * 8
        registry.close()
        assert _open_descriptors() == before
    finally:
        os.close(fd)


def test_registered_bytes_are_bounded(shm_path: Path) -> None:
    """The probe's 64 TiB sparse object: a 413 naming the bound, the first time and every time after."""
    os.truncate(shm_path, 64 << 40)
    with shared_memory_client() as client:
        for _ in range(2):
            answer = _register(client, "huge", f"/{shm_path.name}", 64 << 40)
            assert answer.status_code == 413, answer.text
            assert "POSENC_SHARED_MEMORY_MAX_BYTES" in answer.json()["error"]
        assert _register(client, "small", f"/{shm_path.name}", 8192).status_code == 200
    registry = SharedMemoryRegistry(enabled=True, max_bytes=12288)
    registry.register("a", f"/{shm_path.name}", 0, 8192, TRUSTED)
    with pytest.raises(PayloadTooLarge, match="this server allows 12288 bytes"):
        registry.register("b", f"/{shm_path.name}", 0, 8192, TRUSTED)
    registry.close()


DESCRIPTOR_LIMIT_SCRIPT = """
import json, os, resource, sys
from posenc.service.errors import ServiceError
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from tests.conftest import TRUSTED
resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
open_before = len(os.listdir("/proc/self/fd"))
registry = SharedMemoryRegistry(enabled=True)
answers = []
for index in range(150):
    try:
        registry.register(f"r{index}", sys.argv[1], 0, 8192, TRUSTED)
        answers.append(200)
    except ServiceError as error:
        answers.append((error.status_code, error.message, error.headers))
print(json.dumps({"answers": answers, "open_before": open_before, "open_after": len(os.listdir("/proc/self/fd"))}))
"""


def test_out_of_descriptors_is_a_503_never_a_500(shm_path: Path) -> None:
    """Under a 128-descriptor limit: regions until only the descriptors kept for connections are left (64),
    then 503 with Retry-After."""
    done = subprocess.run([sys.executable, "-c", DESCRIPTOR_LIMIT_SCRIPT, f"/{shm_path.name}"], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).parents[2], check=True)
    seen = json.loads(done.stdout)
    answers = seen["answers"]
    accepted = answers.count(200)
    assert accepted == 128 - 64 - seen["open_before"] and answers[:accepted] == [200] * accepted
    assert seen["open_after"] == 128 - 64  # one descriptor per region, the reserve untouched
    for status, message, headers in answers[accepted:]:
        assert status == 503 and "no file descriptor left" in message and headers == {"Retry-After": "1"}
    assert len(answers) - accepted == 150 - accepted


# --- objects that shrink ----------------------------------------------------------------------------------------------


def test_an_unsealed_object_is_copied_and_a_shrink_is_a_400(shm_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A /dev/shm object can be truncated at any moment, so it is never mapped: inputs are read before the run.
    A truncation that comes after the size check, in the middle of that read, is a short read: a 400."""
    inputs = random_inputs(8, 8, 64, 1, 1)  # 6,152 bytes; the output 2,048
    shm_path.write_bytes(b"".join(array.tobytes() for array in inputs.values()).ljust(16384, b"\0"))
    expected = run(session(REPOSITORY / "rope_attention" / "model.onnx"), inputs)
    output = RequestedOutput("output", shared_memory=SharedMemory("r", expected.nbytes, 8192))
    body = kserve_request(shared_memory_inputs(inputs, "r"), outputs=[output]).body
    with shared_memory_client() as client:
        assert _register(client, "r", f"/{shm_path.name}", 16384).status_code == 200
        assert client.app.state.process.shared_memory._regions[TRUSTED.owner, "r"].mapping is None
        answer = client.post(URL, content=body)
        assert answer.status_code == 200, answer.text
        got = np.frombuffer(shm_path.read_bytes()[8192:8192 + expected.nbytes], np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)

        checked = Region._check_range

        def shrink_after_the_check(region: Region, ref: ShmRef, where: str) -> None:
            checked(region, ref, where)
            os.truncate(shm_path, 600)

        monkeypatch.setattr(Region, "_check_range", shrink_after_the_check)
        answer = client.post(URL, content=body)
        assert answer.status_code == 400 and "now has 600 bytes" in answer.json()["error"]
        monkeypatch.undo()
        os.truncate(shm_path, 16384)
        assert client.post(URL, content=body).status_code == 200


NAME_MAX = "k" * 255


@pytest.mark.parametrize(("key", "name"), [("a", "a"), ("/a", "a"), ("a.b-c_1", "a.b-c_1"), (NAME_MAX, NAME_MAX),
                                           ("/" + NAME_MAX, NAME_MAX)])
def test_shared_memory_object_names_up_to_name_max_are_files_under_dev_shm(key: str, name: str) -> None:
    assert shm_file(key) == "/dev/shm/" + name


@pytest.mark.parametrize("key", ["", "/", NAME_MAX + "k", "/" + NAME_MAX + "k", ".hidden", "/.x", "a/b", "../a", "a b",
                                 7])
def test_anything_else_is_no_shared_memory_object_name(key: object) -> None:
    with pytest.raises(BadRequest, match="'key'"):
        shm_file(key)
