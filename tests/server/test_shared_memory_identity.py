"""The probe of shared memory, repeated against a real server: a client running as uid 65534, which cannot
open root's 0600 objects, tries to make the server read and write them, over TCP and over the Unix socket.

Over TCP it has no key, so every shared-memory call is a 403. Over the Unix socket the server knows it is
uid 65534 and registers only what uid 65534 could open itself; a region someone else registered is no way
around that."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from posenc.service.testing import (
    SHARED_MEMORY_HEADERS,
    RequestedOutput,
    ServerProcess,
    SharedMemory,
    UnixHTTPConnection,
    http_request,
    kserve_request,
    memfd_key,
    register_memfd,
    sealed_memfd,
    shared_memory_inputs,
    shared_memory_key_settings,
    unix_http_request,
)
from tests.onnx_models import REPOSITORY, random_inputs, run, session
from tests.processes import as_user

NOBODY = 65534
INPUTS = random_inputs(8, 8, 64, 1, 1)  # 6,152 bytes; the output 2,048
OUTPUT_AT = 8192

def _register(send: Callable[..., Any], name: str, key: str) -> list[Any]:
    body = json.dumps({"key": key, "byte_size": 16384}).encode()
    status, _, answer = send(f"/v2/systemsharedmemory/region/{name}/register", "POST", body)
    return [status, json.loads(answer or b"{}").get("error", "")]


def _infer(send: Callable[..., Any], region: str, out_region: str) -> list[Any]:
    output = RequestedOutput("output", shared_memory=SharedMemory(out_region, 2048, OUTPUT_AT))
    request = kserve_request(shared_memory_inputs(INPUTS, region), outputs=[output])
    status, _, answer = send("/v2/models/rope_attention/infer", "POST", request.body)
    return [status, json.loads(answer).get("error", "")]


def _probe(socket_path: str, port: int, secret: str, own: str) -> dict[str, Any]:
    """Every shared-memory call the probe could think of, over both listeners: the statuses and errors."""
    def uds(path: str, method: str, body: bytes | None) -> Any:
        return unix_http_request(socket_path, path, method, body)

    def tcp(path: str, method: str, body: bytes | None) -> Any:
        return http_request(port, path, method, body)

    return {
        "tcp_register_secret": _register(tcp, "t1", secret),
        "tcp_register_own": _register(tcp, "t2", own),
        "tcp_status": [tcp("/v2/systemsharedmemory/status", "GET", None)[0]],
        "uds_register_secret": _register(uds, "u1", secret),
        "uds_infer_from_root_region": _infer(uds, "registered_by_root", "registered_by_root"),
        "uds_register_own": _register(uds, "own", own),
        "uds_infer_own": _infer(uds, "own", "own"),
        "uds_status": [uds("/v2/systemsharedmemory/status", "GET", None)[0]],
    }


def as_nobody(probe: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`probe()` run in a forked child that dropped to uid/gid 65534 (no supplementary groups) first."""
    return as_user(NOBODY, probe)


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[Path]:
    """A folder uid 65534 may enter (pytest's own tmp folders are private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="posenc-uds-"))
    folder.chmod(0o755)
    yield folder
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


@pytest.fixture(scope="module")
def server(socket_dir: Path) -> Iterator[ServerProcess]:
    settings = {"shared_memory": True, "uds": socket_dir / "posenc.sock", "log_level": "warning",
                "max_queue_delay_us": 0, **shared_memory_key_settings()}
    with ServerProcess(settings) as process:
        yield process


def _object(owner: int, data: bytes) -> Path:
    path = Path(f"/dev/shm/posenc_identity_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, data.ljust(16384, b"\0"))
    os.fchown(fd, owner, owner)
    os.close(fd)
    return path


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to uid 65534 needs root")
def test_a_client_of_another_uid_gets_only_its_own_objects(server: ServerProcess, socket_dir: Path) -> None:
    payload = b"".join(array.tobytes() for array in INPUTS.values())
    secret, own = _object(0, b"root's secret " * 100), _object(NOBODY, payload)
    try:
        # root registers its secret with the key: uid 65534 must not reach it through that region either
        status, _, answer = http_request(server.port, "/v2/systemsharedmemory/region/registered_by_root/register",
                                         "POST", json.dumps({"key": f"/{secret.name}", "byte_size": 16384}).encode(),
                                         headers=SHARED_MEMORY_HEADERS)
        assert status == 200, answer
        seen = as_nobody(lambda: _probe(str(socket_dir / "posenc.sock"), server.port, f"/{secret.name}",
                                        f"/{own.name}"))
        assert seen["uid"] == NOBODY
        for call in ("tcp_register_secret", "tcp_register_own"):
            assert seen[call][0] == 403 and "POSENC_RESTRICTED_API" in seen[call][1], call
        assert seen["tcp_status"] == [403]
        assert seen["uds_register_secret"][0] == 403 and "uid 65534" in seen["uds_register_secret"][1]
        assert seen["uds_infer_from_root_region"][0] == 400  # root's names are not uid 65534's
        assert "no shared-memory region named 'registered_by_root'" in seen["uds_infer_from_root_region"][1]
        assert seen["uds_register_own"] == [200, ""] and seen["uds_infer_own"] == [200, ""]
        assert seen["uds_status"] == [200]
        assert secret.read_bytes().startswith(b"root's secret ")  # nothing was written to it
        expected = run(session(REPOSITORY / "rope_attention" / "model.onnx"), INPUTS)
        got = np.frombuffer(own.read_bytes()[OUTPUT_AT:OUTPUT_AT + expected.nbytes], np.float32)
        np.testing.assert_allclose(got.reshape(expected.shape), expected, atol=1e-5, rtol=1e-5)
    finally:
        secret.unlink()
        own.unlink()


def test_the_socket_speaks_the_whole_protocol(server: ServerProcess, socket_dir: Path) -> None:
    """Anything but shared memory works on the socket as on TCP; a memfd handed over as `fd:N` is mapped."""
    socket_path = str(socket_dir / "posenc.sock")
    assert unix_http_request(socket_path, "/v2/health/ready")[0] == 200
    status, _, body = unix_http_request(socket_path, "/v1/rope?max_position=4&head_dim=8&format=raw&tensor=cos")
    assert status == 200 and len(body) == 4 * 8 * 4  # [4, 8] float32
    output = RequestedOutput("output", shared_memory=SharedMemory("mine", 2048, OUTPUT_AT))
    request = kserve_request(shared_memory_inputs(INPUTS, "mine"), outputs=[output])
    fd = sealed_memfd(16384)
    try:
        os.pwrite(fd, b"".join(array.tobytes() for array in INPUTS.values()), 0)
        assert register_memfd(socket_path, "mine", fd, 16384)[0] == 200
        status, _, answer = unix_http_request(socket_path, "/v2/models/rope_attention/infer", "POST", request.body)
        assert status == 200, answer
        expected = run(session(REPOSITORY / "rope_attention" / "model.onnx"), INPUTS)
        got = np.frombuffer(os.pread(fd, expected.nbytes, OUTPUT_AT), np.float32).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
        assert unix_http_request(socket_path, "/v2/systemsharedmemory/region/mine/unregister", "POST", b"")[0] == 200
    finally:
        os.close(fd)


def _memfds_held(pid: int, name: str) -> int:
    """How many descriptors of process `pid` are memfds named `name`."""
    folder = Path(f"/proc/{pid}/fd")
    held = 0
    for entry in folder.iterdir():
        with contextlib.suppress(OSError):  # a descriptor closed meanwhile
            held += os.readlink(entry).startswith(f"/memfd:{name} ")
    return held


def test_descriptors_a_request_did_not_take_are_closed_after_its_answer(server: ServerProcess) -> None:
    """Descriptors travel with the first request of a connection only: sent with one that takes none (a
    readiness check), the server closes its copies once that request is answered, while the connection stays
    open, and a register later on the same connection finds none."""
    name = f"posenc-passed-{uuid.uuid4().hex[:8]}"
    fd = sealed_memfd(16384, name)
    connection = UnixHTTPConnection(server.env["POSENC_UDS"], 30, [fd])
    try:
        connection.request("GET", "/v2/health/ready")
        response = connection.getresponse()
        assert response.status == 200
        response.read()
        deadline = time.monotonic() + 5
        while _memfds_held(server.pid, name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _memfds_held(server.pid, name) == 0
        body = json.dumps({"key": memfd_key(fd), "byte_size": 16384}).encode()
        connection.request("POST", "/v2/systemsharedmemory/region/late/register", body=body)
        response = connection.getresponse()
        assert response.status == 400 and "no descriptor came with the request" in response.read().decode()
    finally:
        connection.close()
        os.close(fd)


@pytest.mark.skipif(os.getuid() != 0, reason="dropping to uid 65534 needs root")
def test_a_fifo_registered_as_a_region_is_refused_at_once(server: ServerProcess) -> None:
    """uid 65534 makes a FIFO under /dev/shm and registers it over the Unix socket, without the key: opening it
    must not wait for a writer (it froze the event loop: /readyz timed out, SIGTERM ignored); a 400 at once."""
    fifo = Path(f"/dev/shm/posenc_fifo_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    socket_path = str(server.env["POSENC_UDS"])

    def probe() -> dict[str, Any]:
        os.mkfifo(fifo, 0o600)
        body = json.dumps({"key": fifo.name, "byte_size": 64}).encode()
        status, _, answer = unix_http_request(socket_path, "/v2/systemsharedmemory/region/f/register", "POST",
                                              body, timeout=10)
        return {"status": status, "message": json.loads(answer).get("error", "")}

    try:
        seen = as_nobody(probe)
    finally:
        fifo.unlink(missing_ok=True)
    assert seen["uid"] == NOBODY
    # answered at all (a server waiting for the FIFO's writer never answers: the probe's request times out)
    assert seen["status"] == 400 and "not a regular shared-memory file" in seen["message"], seen
    assert http_request(server.port, "/readyz", timeout=5)[0] == 200  # the event loop still serves
