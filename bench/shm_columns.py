"""The shared-memory columns of `python -m bench infer` (bench/infer.py): the same request with its inputs and output
in registered shared memory.

* `SharedMemoryCase` (HTTP shm copied): /dev/shm objects (tritonclient's shared-memory utilities) over TCP with the
  restricted-API key; objects that may shrink are read with pread before the run and written with pwrite;
* `ZeroCopyCase` (HTTP shm zero-copy): two sealed memfds registered as `fd:N` over `posenc serve`'s Unix socket (the
  server maps them: inputs are views, the output is written in place).
"""

from __future__ import annotations

import http.client
import json
import mmap
import os
from collections.abc import Callable

import numpy as np

from bench.clients import Raw
from posenc.service.request_kit import phases
from posenc.service.testing import (
    SHARED_MEMORY_HEADERS,
    RequestedOutput,
    ServerProcess,
    SharedMemory,
    UnixHTTPConnection,
    http_request,
    kserve_request,
    register_memfd,
    sealed_memfd,
    shared_memory_inputs,
)


class SharedMemoryCase:
    """Inputs and output of one case in two registered system shared-memory regions."""

    def __init__(self, server: ServerProcess, arrays: dict[str, np.ndarray], tag: str) -> None:
        import tritonclient.utils.shared_memory as shm

        self.shm, self.server = shm, server
        self.shape, self.out_size = list(arrays["query"].shape), arrays["query"].nbytes
        in_size = sum(array.nbytes for array in arrays.values())
        self.regions = [(f"in_{tag}", f"/posenc_bench_in_{os.getpid()}_{tag}", in_size),
                        (f"out_{tag}", f"/posenc_bench_out_{os.getpid()}_{tag}", self.out_size)]
        self.handles = [shm.create_shared_memory_region(name, key, size) for name, key, size in self.regions]
        shm.set_shared_memory_region(self.handles[0], list(arrays.values()))
        for name, key, size in self.regions:
            self._post(f"/v2/systemsharedmemory/region/{name}/register",
                       json.dumps({"key": key, "offset": 0, "byte_size": size}).encode())
        output = RequestedOutput("output", shared_memory=SharedMemory(f"out_{tag}", self.out_size))
        self.request = kserve_request(shared_memory_inputs(arrays, f"in_{tag}"), outputs=[output])

    def _post(self, path: str, body: bytes = b"") -> None:
        status, _, answer = http_request(self.server.port, path, "POST", body, headers=SHARED_MEMORY_HEADERS)
        if status != 200:
            raise RuntimeError(f"{path}: HTTP {status}: {answer[:300]!r}")

    def call(self, raw: Raw, model: str) -> Callable[[], np.ndarray]:
        path = f"/v2/models/{model}/infer"

        headers = {**self.request.headers, **SHARED_MEMORY_HEADERS}

        def call() -> np.ndarray:
            raw.post(path, self.request.body, headers)
            return self.shm.get_contents_as_numpy(self.handles[1], np.float32, self.shape)  # a view, no copy
        return call

    def close(self) -> None:
        for name, _, _ in self.regions:
            self._post(f"/v2/systemsharedmemory/region/{name}/unregister")
        for handle in self.handles:
            self.shm.destroy_shared_memory_region(handle)


class ZeroCopyCase:
    """Inputs and output in two sealed memfds, registered over the server's Unix socket as `fd:N` with the
    descriptors sent along (SCM_RIGHTS): the server
    maps them (they cannot shrink), so the inputs reach onnxruntime as views and the output is written in
    place. The request goes over the socket too (one keep-alive connection)."""

    def __init__(self, socket_path: str, arrays: dict[str, np.ndarray], tag: str) -> None:
        self.shape, out_size = arrays["query"].shape, arrays["query"].nbytes
        data = b"".join(np.ascontiguousarray(array).tobytes() for array in arrays.values())
        self.fds = [sealed_memfd(len(data)), sealed_memfd(out_size)]
        os.pwrite(self.fds[0], data, 0)
        self.conn = UnixHTTPConnection(socket_path, timeout=300)
        self.timing: str | None = None  # the last answer's Server-Timing
        self.names = [f"zin_{tag}", f"zout_{tag}"]
        for name, fd, size in zip(self.names, self.fds, (len(data), out_size), strict=True):
            # the descriptor travels with the request (SCM_RIGHTS, a connection of its own)
            status, _, answer = register_memfd(socket_path, name, fd, size)
            if status != 200:
                raise RuntimeError(f"register {name}: HTTP {status}: {answer[:300]!r}")
        self.output = np.frombuffer(mmap.mmap(self.fds[1], out_size, prot=mmap.PROT_READ), np.float32)
        output = RequestedOutput("output", shared_memory=SharedMemory(self.names[1], out_size))
        self.request = kserve_request(shared_memory_inputs(arrays, self.names[0]), outputs=[output])

    def _post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
        try:
            self.conn.request("POST", path, body=body, headers=headers or {})
            response = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # the server closed the kept-alive connection while other columns ran (its keep-alive timeout): again
            self.conn.close()
            self.conn.request("POST", path, body=body, headers=headers or {})
            response = self.conn.getresponse()
        answer = response.read()
        self.timing = response.getheader(phases.HEADER)
        if response.status != 200:
            raise RuntimeError(f"{path}: HTTP {response.status}: {answer[:300]!r}")
        return answer

    def call(self, model: str) -> Callable[[], np.ndarray]:
        path = f"/v2/models/{model}/infer"

        def call() -> np.ndarray:
            self._post(path, self.request.body, self.request.headers)
            return self.output.reshape(self.shape)  # a view of the mapped output, no copy
        return call

    def timing_call(self, model: str) -> Callable[[], str | None]:
        """Post the request; its answer's Server-Timing."""
        call = self.call(model)

        def timing() -> str | None:
            call()
            return self.timing
        return timing

    def close(self) -> None:
        for name in self.names:
            self._post(f"/v2/systemsharedmemory/region/{name}/unregister", b"")
        self.conn.close()
        for fd in self.fds:
            os.close(fd)
