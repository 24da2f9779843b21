"""The clients of `python -m bench infer`, one request at a time or several at once.

* `Raw`: one keep-alive connection posting prepared bodies (geventhttpclient, the HTTP client tritonclient uses);
* `TritonClients`: tritonclient's HTTP client (binary tensors in and out) and gRPC client of one server, the inputs
  set once per case: what a Python user writes, and the same code for posenc and for PyTriton;
* `Endpoint` / `endpoint_call`: a server's protocol and address, and the call that sends one case's request to it and
  answers the output (tritonclient for "http" and "grpc"; LitServe's JSON request for "litserve",
  bench/peer_onnx.py `litserve_body`);
* `Crowd`: N client processes on the load CPUs, each with one endpoint's call, sending back to back for a round
  (closed loop); `crowd_rate` reads requests per second from what each client did.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.isolation import on_cores
from bench.peer_onnx import litserve_body, litserve_output

TIMEOUT_S = 600.0  # no call of the benchmark gives up before this


class Raw:
    """One keep-alive connection posting prepared bodies (the HTTP client tritonclient itself uses)."""

    def __init__(self, host: str, port: int) -> None:
        from geventhttpclient import HTTPClient

        self.client = HTTPClient(host, port, connection_timeout=300, network_timeout=TIMEOUT_S, concurrency=1)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        from geventhttpclient.response import HTTPConnectionClosed

        try:
            response = self.client.post(path, body=body, headers=headers)
        except (HTTPConnectionClosed, BrokenPipeError, ConnectionResetError):
            # the server closed the kept-alive connection while other columns ran (its keep-alive timeout): again,
            # on a new one
            response = self.client.post(path, body=body, headers=headers)
        data = response.read()
        if response.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {response.status_code}: {data[:300]!r}")
        return data, dict(response.items())

    def close(self) -> None:
        self.client.close()


def datatype(array: np.ndarray) -> str:
    from posenc.models.dtypes import lookup

    return lookup(array.dtype).kserve


class TritonClients:
    """tritonclient's HTTP and gRPC clients of one server (`http_address`, `grpc_address`: host:port; either may be
    None)."""

    def __init__(self, http_address: str | None, grpc_address: str | None) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        self.http = httpclient.InferenceServerClient(http_address, network_timeout=TIMEOUT_S) if http_address else None
        self.grpc = grpcclient.InferenceServerClient(grpc_address) if grpc_address else None

    def calls(self, model: str, arrays: dict[str, np.ndarray],
              grpc_headers: dict[str, str] | None = None) -> dict[str, Callable[[], np.ndarray]]:
        """{"http": ..., "grpc": ...}: infer with InferInputs set once (binary over HTTP), `as_numpy` on the result
        (`grpc_headers`: metadata of every gRPC call)."""
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient

        calls: dict[str, Callable[[], np.ndarray]] = {}
        if self.http is not None:
            http, http_tensors = self.http, []
            for name, array in arrays.items():
                tensor = httpclient.InferInput(name, list(array.shape), datatype(array))
                tensor.set_data_from_numpy(array, binary_data=True)
                http_tensors.append(tensor)
            http_outputs = [httpclient.InferRequestedOutput("output", binary_data=True)]

            def over_http() -> np.ndarray:
                return http.infer(model, http_tensors, outputs=http_outputs).as_numpy("output")
            calls["http"] = over_http
        if self.grpc is not None:
            grpc, tensors = self.grpc, []
            for name, array in arrays.items():
                tensor = grpcclient.InferInput(name, list(array.shape), datatype(array))
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)

            def over_grpc() -> np.ndarray:
                return grpc.infer(model, tensors, client_timeout=TIMEOUT_S, headers=grpc_headers).as_numpy("output")
            calls["grpc"] = over_grpc
        return calls

    def close(self) -> None:
        for client in (self.http, self.grpc):
            if client is not None:
                client.close()


@dataclass(frozen=True)
class Endpoint:
    """Where one side of a comparison answers: `protocol` "http" or "grpc" (tritonclient), or "litserve"."""

    protocol: str
    address: str  # host:port

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.address.rpartition(":")
        return host, int(port)


def litserve_path(model: str) -> str:
    """Where LitServe's peer serves a model (bench/litserve_peer.py)."""
    return f"/v2/models/{model}/litserve"


def endpoint_call(endpoint: Endpoint, model: str, arrays: dict[str, np.ndarray],
                  stack: ExitStack) -> Callable[[], np.ndarray]:
    """The call that sends one case's request to `endpoint` and answers its output; its client closes with `stack`."""
    if endpoint.protocol == "litserve":
        raw = Raw(*endpoint.host_port())
        stack.callback(raw.close)
        path, body, headers = litserve_path(model), litserve_body(arrays), {"Content-Type": "application/json"}
        return lambda: litserve_output(*raw.post(path, body, headers))
    if endpoint.protocol not in ("http", "grpc"):
        raise ValueError(f"no client for {endpoint.protocol!r}")
    clients = TritonClients(*((endpoint.address, None) if endpoint.protocol == "http" else (None, endpoint.address)))
    stack.callback(clients.close)
    return clients.calls(model, arrays)[endpoint.protocol]


# --- several clients at once ------------------------------------------------------------------------------------

def crowd_rate(clients: Sequence[tuple[int, float]]) -> float:
    """Requests per second of a closed-loop round from each client's (calls completed, seconds from the common start
    to the end of its last call): the sum of the clients' own rates, so a client that ends one call past the round
    does not leave a fraction of a call uncounted (each client completes at least one)."""
    return sum(calls / seconds for calls, seconds in clients if calls and seconds > 0)


def _crowd_main(conn: Any) -> None:
    """A client process: builds one call per endpoint of a case on request, runs rounds of one of them."""
    from bench.harness import inputs

    stack, model = ExitStack(), ""
    calls: dict[str, Callable[[], np.ndarray]] = {}
    arrays: dict[str, np.ndarray] = {}
    while True:
        message = conn.recv()
        try:
            if message[0] == "quit":
                stack.close()
                conn.send(("ok", None))
                return
            if message[0] == "case":  # a new case: the previous case's clients close
                _, model, batch, seq = message
                stack.close()
                stack, calls, arrays = ExitStack(), {}, inputs(batch, seq, model)
                conn.send(("ok", None))
            elif message[0] == "add":
                _, name, where = message
                calls[name] = endpoint_call(Endpoint(*where), model, arrays, stack)
                calls[name]()  # a first call, untimed: the connection made, the server's first run of the shape done
                conn.send(("ok", None))
            elif message[0] == "run":
                _, name, start_at, seconds = message
                call, done = calls[name], 0
                time.sleep(max(0.0, start_at - time.monotonic()))
                end = start_at + seconds
                while time.monotonic() < end:
                    call()
                    done += 1
                conn.send(("ok", (done, time.monotonic() - start_at)))
        except Exception as exc:  # the parent reports it with the side's name
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class Crowd:
    """`size` client processes on `cpus` (spawned: no state of this process), driven together."""

    def __init__(self, size: int, cpus: frozenset[int]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conns, self.processes = [], []
        with on_cores(cpus):
            for index in range(size):
                conn, child = context.Pipe()
                process = context.Process(target=_crowd_main, args=(child,), name=f"client {index}", daemon=True)
                process.start()
                child.close()
                self.conns.append(conn)
                self.processes.append(process)

    def _all(self, *message: Any) -> list[Any]:
        for conn in self.conns:
            conn.send(message)
        answers = [conn.recv() for conn in self.conns]
        errors = [answer for status, answer in answers if status != "ok"]
        if errors:
            raise RuntimeError(f"{len(errors)} of {len(self.conns)} clients: {errors[0]}")
        return [answer for _, answer in answers]

    def case(self, model: str, batch: int, seq: int) -> None:
        """Every client makes the case's inputs (the previous case's calls are dropped)."""
        self._all("case", model, batch, seq)

    def add(self, name: str, endpoint: Endpoint) -> None:
        """Every client makes the call of `endpoint` for the case, under `name`, and calls it once."""
        self._all("add", name, (endpoint.protocol, endpoint.address))

    def rate(self, name: str, seconds: float) -> float:
        """Requests per second of every client sending `name`'s request back to back for `seconds`."""
        return crowd_rate(self._all("run", name, time.monotonic() + 0.05, seconds))

    def close(self) -> None:
        with suppress(EOFError, OSError, RuntimeError):
            self._all("quit")
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()

    def __enter__(self) -> Crowd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
