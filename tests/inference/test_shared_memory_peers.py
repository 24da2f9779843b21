"""Who a Unix-socket peer is (`peer_of`, from the kernel, at connect time), and what the registry lets each
peer do with a region: access through a primary group only, two peers of one uid that differ in groups, a
region at an offset shrunk under it, and the output size a response reports."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from posenc.service.errors import BadRequest, Forbidden
from posenc.service.http.unix_socket import peer_of
from posenc.service.inference.shared_memory.guard import may_access
from posenc.service.inference.shared_memory.refs import ShmRef
from posenc.service.inference.shared_memory.registry import SharedMemoryRegistry
from posenc.service.request_kit.restricted import SharedMemoryCaller
from posenc.service.request_kit.unix import Peer
from posenc.service.testing import RequestedOutput, SharedMemory, kserve_request, shared_memory_inputs
from tests.conftest import TRUSTED, shared_memory_client
from tests.onnx_models import random_inputs

NOBODY = 65534
GROUP = 4242  # a group nobody else on the host has
as_root_only = pytest.mark.skipif(os.getuid() != 0, reason="another uid and gid need root")


def _peer_seen_by_server(uid: int, gid: int, groups: list[int]) -> tuple[Peer, int]:
    """`peer_of` of a connection from a forked child running as `uid`, primary `gid`, supplementary `groups`;
    and the child's pid."""
    folder = Path(tempfile.mkdtemp(prefix="posenc-peer-"))
    folder.chmod(0o755)
    path = str(folder / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen(1)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(path)
            client.recv(1)  # until the server has looked
            code = 0
        finally:
            os._exit(code)
    try:
        conn, _ = listener.accept()
        with conn:
            peer = peer_of(conn)
            conn.sendall(b"x")
    finally:
        os.waitpid(pid, 0)
        listener.close()
        os.unlink(path)
        folder.rmdir()
    assert peer is not None
    return peer, pid


@as_root_only
def test_peer_of_takes_uid_primary_and_supplementary_groups_from_the_kernel() -> None:
    peer, pid = _peer_seen_by_server(NOBODY, GROUP, [GROUP + 1])
    assert (peer.pid, peer.uid) == (pid, NOBODY)
    assert peer.gids == frozenset({GROUP, GROUP + 1})


@as_root_only
def test_an_object_reached_through_the_primary_group_only() -> None:
    """uid 65534 with primary group GROUP and no supplementary group may use a root:GROUP 0660 object."""
    peer, _ = _peer_seen_by_server(NOBODY, GROUP, [])
    path = Path(f"/dev/shm/posenc_peers_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, 4096)
        os.fchown(fd, 0, GROUP)
        os.fchmod(fd, 0o660)
        assert may_access(peer, os.fstat(fd), write=True)
        registry = SharedMemoryRegistry(enabled=True)
        caller = SharedMemoryCaller(peer, has_key=False)
        registry.register("group", f"/{path.name}", 0, 4096, caller)
        registry.for_caller(caller).write_output(ShmRef("group", 0, 16), np.ones(4, np.float32), "output 'y'")
        assert os.pread(fd, 16, 0) == np.ones(4, np.float32).tobytes()
        registry.close()
    finally:
        os.close(fd)
        path.unlink()


@pytest.fixture
def group_object() -> Iterator[Path]:
    """root:GROUP, mode 0664: members of GROUP may write it, anyone may read it."""
    path = Path(f"/dev/shm/posenc_peers_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 8192)
    os.fchown(fd, 0, GROUP)
    os.fchmod(fd, 0o664)
    os.close(fd)
    yield path
    path.unlink()


@as_root_only
def test_a_peer_of_the_same_uid_that_may_only_read_cannot_name_the_region_as_an_output(group_object: Path) -> None:
    member = SharedMemoryCaller(Peer(1, NOBODY, frozenset({NOBODY, GROUP})), has_key=False)
    reader = SharedMemoryCaller(Peer(2, NOBODY, frozenset({NOBODY})), has_key=False)  # same uid, not in GROUP
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("shared", f"/{group_object.name}", 0, 8192, member)  # writable: the member may write it
    regions = registry.for_caller(reader)
    assert regions.input_array(ShmRef("shared", 0, 16), np.dtype(np.float32), (4,), "x").tolist() == [0.0] * 4
    for write in (lambda: regions.write_output(ShmRef("shared", 0, 16), np.ones(4, np.float32), "output 'y'"),
                  lambda: regions.output_array(ShmRef("shared", 0, 16), np.dtype(np.float32), (4,), "output 'y'", [])):
        with pytest.raises(Forbidden, match=r"uid 65534 .* may not write the object of region 'shared'"):
            write()
    assert group_object.read_bytes() == bytes(8192)
    registry.close()


@as_root_only
def test_a_peer_of_the_same_uid_that_may_not_read_cannot_name_the_region_as_an_input(group_object: Path) -> None:
    """Regions belong to a uid, but a peer of that uid that could not read the object itself (not in its group)
    cannot read it through another peer's region either."""
    group_object.chmod(0o660)  # no access for others
    member = SharedMemoryCaller(Peer(1, NOBODY, frozenset({NOBODY, GROUP})), has_key=False)
    outsider = SharedMemoryCaller(Peer(2, NOBODY, frozenset({NOBODY})), has_key=False)  # same uid, not in GROUP
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("shared", f"/{group_object.name}", 0, 8192, member)
    assert registry.for_caller(member).input_array(ShmRef("shared", 0, 16), np.dtype(np.float32), (4,), "x").size == 4
    with pytest.raises(Forbidden, match=r"^x: uid 65534 .* may not read the object of region 'shared'$"):
        registry.for_caller(outsider).input_array(ShmRef("shared", 0, 16), np.dtype(np.float32), (4,), "x")
    registry.close()


def test_a_region_at_an_offset_is_checked_against_its_end_in_the_object() -> None:
    """Region bytes 4096..8191 of an 8192-byte object; the object shrunk to 6000 bytes (more than the region's
    4096, less than its end at 8192): a 400, never a read or write past the object's end."""
    path = Path(f"/dev/shm/posenc_peers_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    path.write_bytes(bytes(8192))
    try:
        registry = SharedMemoryRegistry(enabled=True)
        registry.register("tail", f"/{path.name}", 4096, 4096, TRUSTED)
        os.truncate(path, 6000)
        regions = registry.for_caller(TRUSTED)
        with pytest.raises(BadRequest, match="now has 6000 bytes, the region needs 8192"):
            regions.input_array(ShmRef("tail", 0, 16), np.dtype(np.float32), (4,), "input 'x'")
        with pytest.raises(BadRequest, match="now has 6000 bytes, the region needs 8192"):
            regions.write_output(ShmRef("tail", 0, 16), np.ones(4, np.float32), "output 'y'")
        assert path.stat().st_size == 6000
        registry.close()
    finally:
        path.unlink()


def test_the_response_reports_the_bytes_of_the_output_not_of_its_region() -> None:
    inputs = random_inputs(8, 8, 64, 1, 1)  # the output: 2,048 bytes
    path = Path(f"/dev/shm/posenc_peers_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    path.write_bytes(b"".join(array.tobytes() for array in inputs.values()).ljust(32768, b"\0"))
    try:
        with shared_memory_client() as client:
            register = {"key": f"/{path.name}", "byte_size": 32768}
            assert client.post("/v2/systemsharedmemory/region/r/register", content=json.dumps(register)).is_success
            output = RequestedOutput("output", shared_memory=SharedMemory("r", 16384, 8192))  # room for 8 outputs
            answer = client.post("/v2/models/rope_attention/infer",
                                 content=kserve_request(shared_memory_inputs(inputs, "r"), outputs=[output]).body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"][0]["parameters"] == {
                "shared_memory_region": "r", "shared_memory_byte_size": 2048, "shared_memory_offset": 8192}
    finally:
        path.unlink()
