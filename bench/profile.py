"""Where one inference's time goes, per case and protocol of `python -m bench infer`: the server's own phases beside
the transport, the client and the same request's onnxruntime run alone.

    | model | B | S | path | latency | onnxruntime alone | client library | transport | route | admit | read | parse
    | queue | run | encode | other |

* latency: the column's median in the latency table (HTTP binary, HTTP shm zero-copy, gRPC raw, gRPC and HTTP
  tritonclient);
* onnxruntime alone: the in-process onnxruntime anchor of the case (the run with nothing around it);
* route, admit, read, parse, queue, run, encode: the median of each phase over calls of that path, from the answers'
  `Server-Timing` header or gRPC's `server-timing` trailing metadata (the bench's servers run with
  POSENC_SERVER_TIMING on; `posenc.service.request_kit.phases` says what each phase holds: route is the request's
  head parsed to the handler's start (HTTP only); admit the admission step before a byte is read; read the body or
  message (receive); queue everything between the parsed request and its run (the wait); run is onnxruntime's);
  the same phases are in `/metrics` (`posenc_inference_phase_duration_us_total`), as Triton exports its own;
* transport: for HTTP, the echo with a bare socket for a client (`SocketEcho`: the request written with sendall,
  the answer read with recv_into into one buffer): the kernel's copies and posenc's server reading and writing
  these bytes, with no HTTP client library; for gRPC, the gRPC echo (grpcio both ends, its client included);
* client library: the echo with the HTTP binary column's client (geventhttpclient, what tritonclient.http runs)
  less the socket echo: what the client library itself adds (its 4 KiB reads, the request joined to its head);
* other: latency less the phases (but read, the bytes' arrival, which the echo covers too: shown, not subtracted)
  and, where measured, transport and client library: the send of the answer, what the echo does not do on its way
  in, for the zero-copy path its client and Unix socket (a small request: no echo to compare with), for the
  tritonclient paths the library's own work.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence

from bench.echo_asgi import ANSWER_HEADER, ECHO_PATH
from bench.harness import med
from posenc.service.request_kit import phases

PHASES = ("route", "admit", "read", "parse", "queue", "run", "encode")
OVERLAPPING = ("read",)  # the bytes' arrival: what the transport's echo times too, so shown and not subtracted
HEADER = ("| model | B | S | path | latency | onnxruntime alone | client library | transport | "
          + " | ".join(PHASES) + " | other |\n|" + "---|" * (9 + len(PHASES)))
NOTE = ("# where the time goes, ms: latency from the table above; onnxruntime alone: the in-process anchor; "
        "route .. encode: the server's phases (Server-Timing, gRPC's server-timing trailer; median); transport: the "
        "HTTP echo over a bare socket, or the gRPC echo; client library: the HTTP echo with geventhttpclient less "
        "the socket's, or tritonclient's gRPC call to the gRPC echo less the raw one's; other: the rest (the "
        "answer's send, client work): bench/profile.py")


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


def profile_row(case: Sequence[object], path: str, latency: float, onnxruntime: float, spans: Mapping[str, float],
                transport: float | None = None, client: float | None = None) -> str:
    """One line of the table (milliseconds): `transport` (the echo a path's bytes take) and `client` (its client
    library's own share) where measured."""
    server = sum(spans.get(name, 0.0) for name in PHASES if name not in OVERLAPPING)
    other = latency - server - (transport or 0.0) - (client or 0.0)
    cells = [*map(str, case), path, f"{latency:.2f}", f"{onnxruntime:.2f}",
             "-" if client is None else f"{client:.2f}", "-" if transport is None else f"{transport:.2f}",
             *(f"{spans.get(name, 0.0):.2f}" for name in PHASES), f"{other:.2f}"]
    return "| " + " | ".join(cells) + " |"
