"""Plain HTTP/1.1 on loopback without a client library: request bytes, one request, one response read.

The kit speaks HTTP itself so that tests can send exactly the bytes they mean (half a head, a stalled body)
and the load generator pays no client library's cost per request.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
from collections.abc import Mapping, Sequence
from typing import Any

from posenc.service.http.descriptor_passing import send_with_descriptors
from posenc.service.testing.ports import LOOPBACK, require_loopback

Response = tuple[int, dict[str, str], bytes]  # status, lower-cased headers, body


def request_head(method: str, path: str, content_length: int | None = None, **headers: str) -> bytes:
    """The head of one request (through the blank line). `Content_Type="..."` is sent as `Content-Type`;
    names that are no identifiers go in as `**{"X-Name": value}`."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {LOOPBACK}"]
    if content_length is not None:
        lines.append(f"Content-Length: {content_length}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def request_bytes(method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None) -> bytes:
    """A whole request: its head (with Content-Length whenever there is a body or the method is POST), then body."""
    length = len(body) if body or method == "POST" else None
    return request_head(method, path, length, **dict(headers or {})) + body


def http_request(port: int, path: str, method: str = "GET", body: bytes | None = None,
                 headers: Mapping[str, str] | None = None, timeout: float = 60, host: str = LOOPBACK) -> Response:
    """One request on a fresh connection (no proxy, whatever the environment says): status, headers, body."""
    conn = http.client.HTTPConnection(require_loopback(host), port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix-domain socket (the server's POSENC_UDS listener). `fds`: descriptors sent with
    the first bytes of the first request (SCM_RIGHTS), as a register of an `fd:N` region needs."""

    def __init__(self, socket_path: str, timeout: float = 60, fds: Sequence[int] = ()) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path
        self.fds = list(fds)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock

    def send(self, data: Any) -> None:
        if self.fds and isinstance(data, bytes | bytearray):
            if self.sock is None:
                self.connect()
            fds, self.fds = self.fds, []
            send_with_descriptors(self.sock, bytes(data), fds)
            return
        super().send(data)


def unix_http_request(socket_path: str, path: str, method: str = "GET", body: bytes | None = None,
                      headers: Mapping[str, str] | None = None, timeout: float = 60,
                      fds: Sequence[int] = ()) -> Response:
    """One request over the Unix socket at `socket_path` (a new connection; `fds` sent with its first bytes):
    status, headers, body."""
    conn = UnixHTTPConnection(socket_path, timeout, fds)
    try:
        conn.request(method, path, body=body, headers=dict(headers or {}))
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


async def read_response(reader: asyncio.StreamReader, keep_body: bool = True
                        ) -> tuple[int, dict[str, str], bytes | None, int]:
    """One complete response from `reader`: status, lower-cased headers, the body (None unless `keep_body`;
    a body that is not kept is read in pieces and dropped) and the bytes read in all. Content-Length,
    chunked, or (neither) up to the end of the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    parts: list[bytes] = []
    nbytes = len(head)

    async def take(size: int) -> None:
        nonlocal nbytes
        while size > 0:
            chunk = await reader.read(min(size, 1 << 20))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", size)
            size -= len(chunk)
            nbytes += len(chunk)
            if keep_body:
                parts.append(chunk)

    if "content-length" in headers:
        await take(int(headers["content-length"]))
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while (size := int((line := await reader.readuntil(b"\r\n")).split(b";")[0], 16)) > 0:
            nbytes += len(line)
            await take(size)
            nbytes += len(await reader.readuntil(b"\r\n"))
        nbytes += len(line) + len(await reader.readuntil(b"\r\n"))
    elif status >= 200 and status not in (204, 304):
        while chunk := await reader.read(1 << 20):
            nbytes += len(chunk)
            if keep_body:
                parts.append(chunk)
    return status, headers, b"".join(parts) if keep_body else None, nbytes
