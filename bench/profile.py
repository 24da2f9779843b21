"""Where one inference's time goes, per case of `python -m bench infer`: the server's own phases beside the
transport and the client.

    | model | B | S | path | latency | client library | transport | route | parse | queue | run | encode | other |

* latency: the column's median in the latency table (HTTP binary, HTTP shm zero-copy);
* route, parse, queue, run, encode: the median of each phase over calls of that path, from the answers'
  `Server-Timing` header (the bench's servers run with POSENC_SERVER_TIMING on; `posenc.service.request_kit.phases`
  says what each phase holds: route is the request's head parsed to the handler's start, routing, middleware and
  dependencies; queue is everything between the parsed request and its run, run is onnxruntime's);
* transport: the echo with a bare socket for a client (`SocketEcho`: the request written with sendall, the
  answer read with recv_into into one buffer): the kernel's copies and posenc's server reading and writing
  these bytes, with no HTTP client library;
* client library: the echo with the HTTP binary column's client (geventhttpclient, what tritonclient.http runs)
  less the socket echo: what the client library itself adds (its 4 KiB reads, the request joined to its head);
* other: latency less all of the above: the response's messages, what the echo does not do on its way in, and,
  for the zero-copy path, its client and Unix socket (a small request: no echo to compare with).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence

from bench.echo_asgi import ANSWER_HEADER, ECHO_PATH
from bench.harness import med
from posenc.service.request_kit import phases

PHASES = ("route", "parse", "queue", "run", "encode")
HEADER = ("| model | B | S | path | latency | client library | transport | route | parse | queue | run | encode | "
          "other |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
NOTE = ("# where the time goes: latency from the table above; route/parse/queue/run/encode: the server's "
        "Server-Timing (median); transport: the echo over a bare socket; client library: the echo with "
        "geventhttpclient less that; other: the rest (the response; for zero-copy also its client): bench/profile.py")


class SocketEcho:
    """The echo of `body_bytes` in and `answer_bytes` out over one kept-alive socket, with no client library."""

    def __init__(self, host: str, port: int, body_bytes: int, answer_bytes: int) -> None:
        self.address = (host, port)
        self.sock: socket.socket | None = None
        self.head = (f"POST {ECHO_PATH} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {body_bytes}\r\n"
                     f"{ANSWER_HEADER.decode()}: {answer_bytes}\r\n\r\n").encode()
        self.body = bytes(body_bytes)
        self.answer = bytearray(answer_bytes + 4096)  # the body and its response head

    def call(self) -> int:
        """Post the body, read the whole answer; its body's size. A connection the server closed while other
        columns ran (its keep-alive timeout) is opened again, as the client libraries do."""
        try:
            return self._call()
        except (BrokenPipeError, ConnectionResetError, EOFError):
            self.close()
            return self._call()

    def _call(self) -> int:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=300)
        self.sock.sendall(self.head)
        self.sock.sendall(self.body)
        view, received, body_start, end = memoryview(self.answer), 0, -1, -1
        while end < 0 or received < end:
            count = self.sock.recv_into(view[received:])
            if count == 0:
                raise EOFError("the echo server closed the connection")
            received += count
            if end < 0 and (head_end := self.answer.find(b"\r\n\r\n", 0, received)) >= 0:
                body_start = head_end + 4
                end = body_start + _content_length(bytes(self.answer[:head_end]))
        return end - body_start

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise ValueError(f"no Content-Length in the echo's answer: {head[:200]!r}")


def median_phases(timing: Callable[[], str | None], calls: int) -> dict[str, float]:
    """Milliseconds by phase, the median over `calls` calls of `timing` (one request; its Server-Timing value)."""
    seen: dict[str, list[float]] = {}
    for _ in range(calls):
        value = timing()
        if value is None:
            raise RuntimeError("the answer has no Server-Timing header: is POSENC_SERVER_TIMING on?")
        for name, ms in phases.parse(value).items():
            seen.setdefault(name, []).append(ms)
    return {name: med(values) for name, values in seen.items()}


def profile_row(case: Sequence[object], path: str, latency: float, spans: Mapping[str, float],
                echo: float | None = None, socket_echo: float | None = None) -> str:
    """One line of the table (milliseconds); `echo` and `socket_echo` for a path that moves its tensors over
    HTTP."""
    server = sum(spans.get(name, 0.0) for name in PHASES)
    if echo is not None and socket_echo is not None:
        client, transport, other = f"{echo - socket_echo:.2f}", f"{socket_echo:.2f}", latency - echo - server
    else:
        client, transport, other = "-", "-", latency - server
    cells = [*map(str, case), path, f"{latency:.2f}", client, transport,
             *(f"{spans.get(name, 0.0):.2f}" for name in PHASES), f"{other:.2f}"]
    return "| " + " | ".join(cells) + " |"
