"""Shared memory between users of one host, against a real server: regions belong to whoever registered
them, a descriptor travels with the request (never found through the client's pid), and an object that
refuses writes is a 400, never a 500.

The attacks run as uid 65534 in forked children (the tests run as root; elsewhere they are skipped)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from posenc.service.testing import (
    RequestedOutput,
    ServerProcess,
    SharedMemory,
    kserve_request,
    register_memfd,
    shared_memory_inputs,
    unix_http_request,
)
from posenc.service.testing.http import request_bytes
from tests.onnx_models import REPOSITORY, random_inputs, run, session
from tests.server.test_shared_memory_identity import NOBODY, as_nobody

INPUTS = random_inputs(8, 8, 64, 1, 1)  # 6,152 bytes; the output 2,048
PAYLOAD = b"".join(array.tobytes() for array in INPUTS.values())
OUTPUT_AT = 8192
SIZE = 16384
INFER = "/v2/models/rope_attention/infer"
as_root_only = pytest.mark.skipif(os.getuid() != 0, reason="a second uid needs root")


@pytest.fixture(scope="module")
def socket_path() -> Iterator[str]:
    folder = Path(tempfile.mkdtemp(prefix="posenc-owners-"))
    folder.chmod(0o755)  # uid 65534 may reach the socket
    settings = {"shared_memory": True, "uds": folder / "posenc.sock", "log_level": "warning",
                "max_queue_delay_us": 0}
    with ServerProcess(settings) as _:
        yield str(folder / "posenc.sock")
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def _object(owner: int, mode: int, data: bytes) -> Path:
    path = Path(f"/dev/shm/posenc_owners_{os.getpid()}_{uuid.uuid4().hex[:8]}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.write(fd, data.ljust(SIZE, b"\0"))
    os.fchown(fd, owner, owner)
    os.fchmod(fd, mode)
    os.close(fd)
    return path


def _call(socket_path: str, path: str, body: dict[str, Any] | bytes | None = None) -> list[Any]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    status, _, answer = unix_http_request(socket_path, path, "GET" if body is None else "POST", data)
    return [status, json.loads(answer or b"null")]


def _infer_to(region: str) -> bytes:
    output = RequestedOutput("output", shared_memory=SharedMemory(region, 2048, OUTPUT_AT))
    return kserve_request(shared_memory_inputs(INPUTS, region), outputs=[output]).body


def _expected() -> np.ndarray:
    return run(session(REPOSITORY / "rope_attention" / "model.onnx"), INPUTS)


# --- 1. regions belong to whoever registered them ------------------------------------------------------------------


@as_root_only
def test_another_uid_neither_sees_nor_replaces_nor_wipes_a_region(socket_path: str) -> None:
    mine, theirs = _object(0, 0o600, PAYLOAD), _object(NOBODY, 0o666, PAYLOAD)  # an output there shows
    try:
        register = {"key": f"/{mine.name}", "byte_size": SIZE}
        assert _call(socket_path, "/v2/systemsharedmemory/region/results/register", register)[0] == 200

        def hijack() -> dict[str, Any]:
            base = "/v2/systemsharedmemory"
            return {
                "status": _call(socket_path, f"{base}/status"),
                "status_one": _call(socket_path, f"{base}/region/results/status")[0],
                "unregister": _call(socket_path, f"{base}/region/results/unregister", b"")[0],
                "register": _call(socket_path, f"{base}/region/results/register",
                                  {"key": f"/{theirs.name}", "byte_size": SIZE})[0],
                "own_status": _call(socket_path, f"{base}/status")[1],
                "unregister_all": _call(socket_path, f"{base}/unregister", b"")[0],
            }

        seen = as_nobody(hijack)
        assert seen["status"] == [200, []], "uid 65534 was shown root's regions"
        assert seen["status_one"] == 404
        assert seen["unregister"] == 200 and seen["register"] == 200  # in its own scope: nothing of root's
        assert [region["key"] for region in seen["own_status"]] == [f"/{theirs.name}"]
        assert seen["unregister_all"] == 200
        assert _call(socket_path, "/v2/systemsharedmemory/status") == [200, [
            {"name": "results", "key": f"/{mine.name}", "offset": 0, "byte_size": SIZE}]]
        status, _, answer = unix_http_request(socket_path, INFER, "POST", _infer_to("results"))
        assert status == 200, answer
        got = np.frombuffer(mine.read_bytes()[OUTPUT_AT:OUTPUT_AT + 2048], np.float32).reshape(_expected().shape)
        np.testing.assert_allclose(got, _expected(), atol=1e-5, rtol=1e-5)
        assert theirs.read_bytes()[OUTPUT_AT:] == bytes(SIZE - OUTPUT_AT), "root's output went to uid 65534's object"
    finally:
        _call(socket_path, "/v2/systemsharedmemory/unregister", b"")
        mine.unlink()
        theirs.unlink()


# --- 2. a descriptor travels with the message, never by pid --------------------------------------------------------

STOLEN_FD = 900


def _fork(child: Callable[[], None]) -> int:
    """`child()` in a forked process that never returns into pytest, and dies within a minute whatever it waits on."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(60)
            child()
            code = 0
        finally:
            os._exit(code)
    return pid


def _root_at_pid(pid: int, ready: int, done: int) -> int | None:
    """A root process holding a memfd (`PAYLOAD`) at descriptor STOLEN_FD, forked so that it gets `pid`;
    None when another process took that pid first (a busy host). It writes to the pipe `ready` when it holds
    the memfd, then (after a byte on the pipe `done`) whether the memfd is still as it was."""
    def holder() -> None:
        if os.getpid() != pid:
            return
        fd = os.memfd_create("root-secret", os.MFD_CLOEXEC)
        os.write(fd, PAYLOAD.ljust(SIZE, b"\0"))
        os.dup2(fd, STOLEN_FD, inheritable=False)
        os.write(ready, b"1")
        if os.read(done, 1) != b"x":  # until the attack is over
            return
        os.write(ready, b"1" if os.pread(STOLEN_FD, SIZE, 0)[OUTPUT_AT:] == bytes(SIZE - OUTPUT_AT) else b"0")

    for _ in range(20):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        child = _fork(holder)
        if child == pid:
            return child
        os.waitpid(child, 0)  # the wrong pid: its pipes are gone with it
    return None


@as_root_only
def test_a_descriptor_is_never_looked_up_through_the_peers_pid(socket_path: str) -> None:
    """The probe: uid 65534 connects, hands the connection to a child and exits; a root process takes its pid
    with a memfd at descriptor 900; the child registers `fd:900`. The server must not open root's memfd."""
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("pid reuse cannot be arranged here (ns_last_pid)")
    go_read, go = os.pipe()
    report, report_write = os.pipe()
    connector_pid_r, connector_pid_w = os.pipe()

    def connector() -> None:
        import socket
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(socket_path)  # SO_PEERCRED records this process's pid
        if _fork(lambda: _attack(sock, go_read, report_write)) > 0:
            os.write(connector_pid_w, str(os.getpid()).encode())

    connector_pid = _fork(connector)
    assert int(os.read(connector_pid_r, 16)) == connector_pid
    os.waitpid(connector_pid, 0)  # the pid is free for the taking
    ready_read, ready = os.pipe()
    done_read, done = os.pipe()
    root = _root_at_pid(connector_pid, ready, done_read)
    if root is None:
        os.write(go, b"q")
        pytest.skip("another process took the pid first")
    try:
        assert os.read(ready_read, 1) == b"1"
        os.write(go, b"g")
        seen = json.loads(os.read(report, 65536))
        os.write(done, b"x")
        untouched = os.read(ready_read, 1) == b"1"
    finally:
        os.write(done, b"q")
        os.waitpid(root, 0)
        _call(socket_path, "/v2/systemsharedmemory/unregister", b"")
    assert seen["register"][0] == 400, f"the server opened the pid's descriptor: {seen}"
    assert "no descriptor came with the request" in seen["register"][1]
    assert untouched, "the server wrote into root's memfd"


def _attack(sock: Any, go: int, report: int) -> None:
    """The connection's holder (uid 65534): on `go`, register `fd:900` on the inherited connection, then
    infer with its output into that region; the answers to `report`."""
    if os.read(go, 1) != b"g":
        return
    body = json.dumps({"key": f"fd:{STOLEN_FD}", "byte_size": SIZE}).encode()
    sock.sendall(request_bytes("POST", "/v2/systemsharedmemory/region/stolen/register", body))
    result = {"register": _read(sock)}
    if result["register"][0] == 200:
        sock.sendall(request_bytes("POST", INFER, _infer_to("stolen")))
        result["infer"] = _read(sock)
    os.write(report, json.dumps(result).encode())


def _read(sock: Any) -> list[Any]:
    import http.client
    response = http.client.HTTPResponse(sock)
    response.begin()
    answer = response.read()
    return [response.status, json.loads(answer or b"{}").get("error", "")]


def test_a_passed_memfd_is_registered_and_mapped(socket_path: str) -> None:
    """The documented client helper: the descriptor goes with the request; the region is the caller's."""
    from posenc.service.testing import sealed_memfd
    fd = sealed_memfd(SIZE)
    try:
        os.pwrite(fd, PAYLOAD, 0)
        assert register_memfd(socket_path, "passed", fd, SIZE)[0] == 200
        status, _, answer = unix_http_request(socket_path, INFER, "POST", _infer_to("passed"))
        assert status == 200, answer
        got = np.frombuffer(os.pread(fd, 2048, OUTPUT_AT), np.float32).reshape(_expected().shape)
        np.testing.assert_allclose(got, _expected(), atol=1e-5, rtol=1e-5)
    finally:
        _call(socket_path, "/v2/systemsharedmemory/unregister", b"")
        os.close(fd)


# --- 3. seals and modes, checked where they matter ---------------------------------------------------------------

F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
SEALS = {"F_SEAL_WRITE": fcntl.F_SEAL_WRITE, "F_SEAL_FUTURE_WRITE": F_SEAL_FUTURE_WRITE,
         "F_SEAL_SHRINK": fcntl.F_SEAL_SHRINK, "F_SEAL_GROW": fcntl.F_SEAL_GROW, "F_SEAL_SEAL": fcntl.F_SEAL_SEAL}


@pytest.mark.parametrize("seal", list(SEALS))
def test_a_seal_added_after_registration(socket_path: str, seal: str) -> None:
    """An unsealed memfd (copied), sealed after it was registered: a seal against writing makes the output a
    400 naming the object and the seal; any other seal changes nothing."""
    fd = os.memfd_create("sealed-later", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.pwrite(fd, PAYLOAD.ljust(SIZE, b"\0"), 0)
        assert register_memfd(socket_path, "later", fd, SIZE)[0] == 200
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS[seal])
        status, _, answer = unix_http_request(socket_path, INFER, "POST", _infer_to("later"))
        if "WRITE" in seal:
            error = json.loads(answer)["error"]
            assert status == 400, answer
            assert f"fd:{fd}" in error and "region 'later'" in error and seal in error
            assert os.pread(fd, 2048, OUTPUT_AT) == bytes(2048)
        else:
            assert status == 200, answer
            assert os.pread(fd, 2048, OUTPUT_AT) != bytes(2048)
    finally:
        _call(socket_path, "/v2/systemsharedmemory/unregister", b"")
        os.close(fd)


def test_a_memfd_sealed_against_writing_is_registered_read_only(socket_path: str) -> None:
    """Sealed against writing and shrinking before it is registered: inputs are read from it (mapped); an
    output there is a 400 naming the seal. The register is no 507 'cannot map it'."""
    fd = os.memfd_create("sealed-before", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.pwrite(fd, PAYLOAD.ljust(SIZE, b"\0"), 0)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK)
        status, _, answer = register_memfd(socket_path, "sealed", fd, SIZE)
        assert status == 200, answer
        status, _, answer = unix_http_request(socket_path, INFER, "POST", _infer_to("sealed"))
        assert status == 400 and "F_SEAL_WRITE" in json.loads(answer)["error"], answer
        request = kserve_request(shared_memory_inputs(INPUTS, "sealed"))
        status, _, answer = unix_http_request(socket_path, INFER, "POST", request.body)
        assert status == 200, answer
    finally:
        _call(socket_path, "/v2/systemsharedmemory/unregister", b"")
        os.close(fd)

