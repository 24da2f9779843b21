"""The peer columns of `python -m bench infer`: posenc against NVIDIA PyTriton (HTTP and gRPC) and LitServe (HTTP),
each serving the same graph with the same onnxruntime and one intra-op thread per server (bench/peers.py).

* 1 client: each peer's call joins the columns bench/infer.py measures in interleaved rounds (median ms per call,
  every side alone in bursts), against posenc's column of the same protocol sent by the same client code: tritonclient
  with binary tensors over HTTP, tritonclient over gRPC (bench/clients.py `TritonClients`). LitServe reads a request
  body as JSON, so its client posts each input's bytes as base64 (bench/peer_onnx.py `litserve_body`) and reads the
  output's raw bytes; it is held to posenc over tritonclient HTTP.
* 8 clients: `CLIENTS` client processes on the load CPUs send one side's request back to back (closed loop), each
  side alone, the sides in interleaved rounds (the order reversed every other round); req/s is the median of the
  rounds (bench/clients.py `crowd_rate`). A second posenc HTTP side in the same rounds is the control.
Ratios are posenc over peer, oriented so that higher is better for posenc (1 client: the peer's ms over posenc's;
8 clients: posenc's req/s over the peer's). Targets (issue 64): ≥ 1.5 against PyTriton HTTP, ≥ 1.3 against PyTriton
gRPC, both client counts; LitServe's rows are informational. A peer that cannot be installed, started or that answers
wrongly is a row with the reason, never a failed run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.clients import Crowd, Endpoint, endpoint_call
from bench.harness import Row, Servers, interleaved, log, med, spread
from bench.isolation import SETTLE_S, Cores, cpu_model
from bench.peers import LITSERVE, PYTRITON, Peer, peer_python, start_litserve, start_pytriton
from posenc.service.testing import ServerProcess

CLIENTS = 8  # concurrent clients of the req/s columns
PYTRITON_HTTP_TARGET, PYTRITON_GRPC_TARGET = 1.5, 1.3  # posenc / PyTriton, per protocol
CALLS_PER_CLIENT = 2  # a crowd round lasts at least this many calls of each client (by the side's 1-client latency)
MOST_ROUND_S = 10.0  # and at most this long
ROUNDS = 3  # crowd rounds per side unless --rounds
ATOL = RTOL = 1e-4  # a peer's output against the in-process onnxruntime anchor's


@dataclass(frozen=True)
class Side:
    """One peer protocol and the posenc column it is held to."""

    key: str  # its column in bench/infer.py's times
    peer: Peer
    protocol: str  # HTTP, gRPC
    posenc: str  # posenc's column of the same protocol and client
    target: float | None
    client: str


SIDES = (
    Side("pytriton http", PYTRITON, "HTTP", "http tritonclient", PYTRITON_HTTP_TARGET, "tritonclient, binary tensors"),
    Side("pytriton grpc", PYTRITON, "gRPC", "grpc tritonclient", PYTRITON_GRPC_TARGET, "tritonclient"),
    Side("litserve", LITSERVE, "HTTP", "http tritonclient", None,
         "JSON with base64 tensors in, raw bytes out (posenc: tritonclient, binary tensors)"),
)
POSENC = {"http tritonclient": "posenc http", "grpc tritonclient": "posenc grpc"}  # 1-client column: crowd side
CONTROL = "posenc http (control)"


@dataclass
class PeerResult:
    """One side on one case (`case` None with `why`: the peer was not measured)."""

    side: Side
    case: tuple[str, int, int] | None = None
    posenc_ms: float = math.nan
    peer_ms: float = math.nan
    posenc_rps: float = math.nan
    peer_rps: float = math.nan
    why: str = ""


def latency_ratio(posenc_ms: float, peer_ms: float) -> float:
    """posenc over peer for latencies: the peer's ms over posenc's (nan where either is missing)."""
    return peer_ms / posenc_ms if posenc_ms > 0 and peer_ms > 0 else math.nan


def rate_ratio(posenc_rps: float, peer_rps: float) -> float:
    """posenc over peer for rates: posenc's req/s over the peer's (nan where either is missing)."""
    return posenc_rps / peer_rps if posenc_rps > 0 and peer_rps > 0 else math.nan


def _cell(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


def _ratio(value: float, target: float | None) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:.2f}" + ("" if target is None else " ✓" if value >= target else " ✗")


def format_peer_table(cpu: str, where: str, results: list[PeerResult]) -> str:
    """The peers' table: per case and protocol, posenc and the peer at 1 and CLIENTS clients and posenc / peer."""
    lines = [f"# posenc vs peers on {cpu}; {where}; ratio = posenc / peer (1 client: the peer's ms over posenc's; "
             f"{CLIENTS} clients: posenc's req/s over the peer's), higher is better for posenc",
             f"| model | B | S | protocol | peer | client | posenc, 1 client | peer, 1 client | ratio | posenc, "
             f"{CLIENTS} clients | peer, {CLIENTS} clients | ratio | target |",
             "|---" * 13 + "|"]
    for r in results:
        side, target = r.side, "-" if r.side.target is None else f"≥ {r.side.target:.1f}"
        if r.why:
            lines.append(f"| {' | '.join(map(str, r.case or ('-', '-', '-')))} | {side.protocol} | {side.peer.name} "
                         f"| {side.client} | not measured: {r.why} |||||| {target} |")
            continue
        lines.append(f"| {' | '.join(map(str, r.case or ()))} | {side.protocol} | {side.peer.name} | {side.client} "
                     f"| {_cell(r.posenc_ms, 'ms')} | {_cell(r.peer_ms, 'ms')} "
                     f"| {_ratio(latency_ratio(r.posenc_ms, r.peer_ms), side.target)} "
                     f"| {_cell(r.posenc_rps, 'req/s')} | {_cell(r.peer_rps, 'req/s')} "
                     f"| {_ratio(rate_ratio(r.posenc_rps, r.peer_rps), side.target)} | {target} |")
    return "\n".join(lines)


def result_rows(result: PeerResult, times: dict[str, list[float]] | None = None, control: float | None = None,
                crowd_control: float | None = None) -> list[Row]:
    """The ratio-table rows of one result: 1 client (ms) and CLIENTS clients (req/s); one informational row with
    the reason where the peer was not measured."""
    side = result.side
    what = f"{side.peer.name} {side.protocol}"
    if result.why:
        where = "" if result.case is None else " " + " ".join(map(str, result.case))
        return [Row(f"posenc vs {what}{where}", math.nan, math.nan, "ms", False, None, f"not measured: {result.why}")]
    model, batch, seq = result.case or ("", 0, 0)
    where = f"{model} B={batch} S={seq}"
    note = f"the same graph and onnxruntime; client: {side.client}"
    single = (f"{spread(times[side.posenc], times[side.key], False)}; " if times else "") + note
    return [Row(f"posenc vs {what}, 1 client {where}", result.posenc_ms, result.peer_ms, "ms", False, side.target,
                single, control=control),
            Row(f"posenc vs {what}, {CLIENTS} clients {where}", result.posenc_rps, result.peer_rps, "req/s", True,
                side.target, note, control=crowd_control)]


class PeerColumns:
    """The peers of one `bench infer` run: started once (after posenc's servers are ready), measured per case."""

    def __init__(self, servers: Servers, cores: Cores, models: list[str], threads: int, wanted: dict[Peer, bool | None],
                 quick: bool) -> None:
        self.cores = cores
        self.results: list[PeerResult] = []
        self.failed: dict[Peer, str] = {}
        self.servers: dict[Peer, ServerProcess] = {}
        starters = {PYTRITON: start_pytriton, LITSERVE: start_litserve}
        for peer, start in starters.items():
            want = wanted.get(peer)
            if want is False:
                self.failed[peer] = f"--no-{peer.key}"
                continue
            python, why = peer_python(peer, create=want is True or not quick)
            if python is None:
                self.failed[peer] = why
                continue
            try:
                self.servers[peer] = start(servers, python, models, threads)
            except (RuntimeError, OSError) as exc:  # not ready: its log's tail says why
                self.failed[peer] = " ".join(str(exc).split())[-400:]
        for side in SIDES:
            if side.peer in self.failed:
                self.results.append(PeerResult(side, why=self.failed[side.peer]))
        self.crowd = Crowd(CLIENTS, cores.load) if self.servers else None
        self.stack = ExitStack()

    def live(self) -> list[Side]:
        return [side for side in SIDES if side.peer in self.servers and side.peer not in self.failed]

    def note(self) -> str:
        names = {side.peer.name: side.peer for side in SIDES}
        states = [f"{name}: {'on' if peer in self.servers else 'not measured: ' + self.failed.get(peer, '?')}"
                  for name, peer in names.items()]
        return f"# peers (bench/peer_columns.py, {CLIENTS} clients in the req/s columns): " + "; ".join(states)

    def endpoint(self, side: Side) -> Endpoint:
        server = self.servers[side.peer]
        return Endpoint("grpc", server.grpc_address) if side.protocol == "gRPC" else \
            Endpoint("litserve" if side.peer is LITSERVE else "http", server.address)

    def calls(self, model: str, arrays: dict[str, np.ndarray], expected: np.ndarray) -> dict[str, Callable[[], Any]]:
        """The 1-client calls of the live peers for a case, each checked against `expected` first (a peer that
        fails or answers otherwise is left out, with the reason, for the rest of the run)."""
        self.stack.close()
        self.stack = ExitStack()
        calls: dict[str, Callable[[], Any]] = {}
        for side in self.live():
            try:
                call = endpoint_call(self.endpoint(side), model, arrays, self.stack)
                np.testing.assert_allclose(call(), expected, atol=ATOL, rtol=RTOL)
            except Exception as exc:  # any failure of a peer is reported, never raised
                self._fail(side.peer, f"{side.key}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
                continue
            calls[side.key] = call
        return calls

    def _fail(self, peer: Peer, why: str) -> None:
        log(f"{peer.name} left out: {why}")
        self.failed[peer] = why
        self.results += [PeerResult(side, why=why) for side in SIDES if side.peer is peer]

    def measure(self, case: tuple[str, int, int], posenc: ServerProcess, times: dict[str, list[float]],
                rounds: int, seconds: float, control: float | None) -> list[Row]:
        """The CLIENTS-client rounds of the case (posenc's sides and every live peer's), its results and rows."""
        live = [side for side in self.live() if side.key in times]
        if self.crowd is None or not live:
            return []
        crowd = self.crowd
        crowd.case(*case)
        sides = {"posenc http": (Endpoint("http", posenc.address), "http tritonclient"),
                 CONTROL: (Endpoint("http", posenc.address), "http tritonclient")}
        if any(side.protocol == "gRPC" for side in live):
            sides["posenc grpc"] = (Endpoint("grpc", posenc.grpc_address), "grpc tritonclient")
        for name, (endpoint, _) in sides.items():
            crowd.add(name, endpoint)
        for side in list(live):
            try:
                crowd.add(side.key, self.endpoint(side))
            except RuntimeError as exc:
                self._fail(side.peer, f"{CLIENTS} clients: {exc}")
                live.remove(side)
        sides.update({side.key: (self.endpoint(side), side.key) for side in live})

        def one(name: str, column: str) -> Callable[[], float]:
            # a round of at least CALLS_PER_CLIENT calls per client, judged by the side's 1-client latency
            length = min(MOST_ROUND_S, max(seconds, CALLS_PER_CLIENT * CLIENTS * med(times[column]) / 1000))

            def side() -> float:
                time.sleep(SETTLE_S)
                try:
                    return crowd.rate(name, length)
                except RuntimeError as exc:
                    if name not in {side.key for side in live}:
                        raise
                    log(f"{name}: {exc}")
                    return math.nan
            return side

        rates = dict(zip(sides, interleaved(rounds, *(one(name, column) for name, (_, column) in sides.items())),
                         strict=True))
        rps = {name: med(values) for name, values in rates.items()}
        crowd_control = rps[CONTROL] / rps["posenc http"]
        rows = []
        for side in live:
            if any(math.isnan(v) for v in rates[side.key]):
                self._fail(side.peer, f"{side.key}: a request of {CLIENTS} clients failed (see the log above)")
                continue
            result = PeerResult(side, case, med(times[side.posenc]), med(times[side.key]),
                                rps[POSENC[side.posenc]], rps[side.key])
            self.results.append(result)
            rows += result_rows(result, times, control, crowd_control)
        log(f"{case}: {CLIENTS} clients, req/s: " + ", ".join(f"{name} {value:.1f}" for name, value in rps.items()))
        return rows

    def rows_not_measured(self) -> list[Row]:
        """One row per side of a peer that was not measured (or left out), with its reason."""
        return [row for result in self.results if result.why for row in result_rows(result)]

    def table(self, threads: int) -> str:
        where = (f"servers and in-process onnxruntime on CPU {','.join(map(str, sorted(self.cores.serve)))}, clients "
                 f"on CPU {','.join(map(str, sorted(self.cores.load)))}" if self.cores.pinned else "not pinned")
        return format_peer_table(cpu_model(), f"{where}; {threads} intra-op thread(s) in every server", self.results)

    def close(self) -> None:
        self.stack.close()
        if self.crowd is not None:
            self.crowd.close()
