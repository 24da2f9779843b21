"""posenc's test kit: what tests, benchmarks and scripts need to drive a real posenc, in one place.

    from posenc.service.testing import ServerProcess, LoadGenerator, kserve_request, decode_response

* `free_port`, `require_loopback` (ports.py): a free loopback port; everything here stays on this host.
* `ServerProcess` (server.py): `posenc serve` (or another server command) in a subprocess with POSENC_*
  settings, ready when a path answers 200, its output in a log file, stopped by PID (SIGTERM, then SIGKILL
  after a bound). `python -m posenc.service.testing.serve` starts one for shell scripts.
* `kserve_request`, `decode_response` (kserve.py): KServe v2 infer requests, JSON and binary tensors,
  shared-memory inputs and outputs, with datatype names from models/dtypes.py; responses back to arrays.
* `LoadGenerator` (load.py): bounded closed-loop load over keep-alive connections, every body read.
* `request_head`, `request_bytes`, `http_request`, `read_response`, `unix_http_request` (http.py): plain
  HTTP/1.1 on loopback, or on the server's Unix socket.
* `shared_memory_key_settings`, `SHARED_MEMORY_HEADERS`, `sealed_memfd`, `register_memfd` (shared_memory.py):
  the restricted-API key TCP clients need for shared memory, and zero-copy memfds for Unix-socket clients,
  registered by sending the descriptor itself.
* `attention_inputs` (inputs.py): seeded inputs for the shipped RoPE-attention graphs.

Imports only the standard library, numpy and posenc's own modules: it ships with the service.
"""

from posenc.service.testing.http import (
    UnixHTTPConnection,
    http_request,
    read_response,
    request_bytes,
    request_head,
    unix_http_request,
)
from posenc.service.testing.inputs import attention_inputs, layered_config
from posenc.service.testing.kserve import (
    HEADER_LENGTH,
    KServeRequest,
    KServeResponse,
    RequestedOutput,
    SharedMemory,
    SharedMemoryInput,
    decode_response,
    kserve_request,
    request_with_header,
    shared_memory_inputs,
)
from posenc.service.testing.load import HttpRequest, LoadGenerator, LoadResult, Outcome
from posenc.service.testing.ports import LOOPBACK, free_port, require_loopback
from posenc.service.testing.server import ServerProcess, serve_command, serve_env, setting_variable, without_posenc
from posenc.service.testing.shared_memory import (
    SHARED_MEMORY_HEADERS,
    SHARED_MEMORY_KEY,
    SHARED_MEMORY_KEY_HEADER,
    memfd_key,
    register_memfd,
    sealed_memfd,
    shared_memory_key_settings,
)

__all__ = [
    "HEADER_LENGTH",
    "LOOPBACK",
    "SHARED_MEMORY_HEADERS",
    "SHARED_MEMORY_KEY",
    "SHARED_MEMORY_KEY_HEADER",
    "HttpRequest",
    "KServeRequest",
    "KServeResponse",
    "LoadGenerator",
    "LoadResult",
    "Outcome",
    "RequestedOutput",
    "ServerProcess",
    "SharedMemory",
    "SharedMemoryInput",
    "UnixHTTPConnection",
    "attention_inputs",
    "decode_response",
    "free_port",
    "http_request",
    "kserve_request",
    "layered_config",
    "memfd_key",
    "read_response",
    "register_memfd",
    "request_bytes",
    "request_head",
    "request_with_header",
    "require_loopback",
    "sealed_memfd",
    "serve_command",
    "serve_env",
    "setting_variable",
    "shared_memory_inputs",
    "shared_memory_key_settings",
    "unix_http_request",
    "without_posenc",
]
