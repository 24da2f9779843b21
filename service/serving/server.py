"""How `posenc serve` runs uvicorn: its connection protocol (`posenc.service.http.protocol`: the request
timeouts and limits uvicorn lacks), a bounded drain, a clean exit status.

`Server` runs one process without uvicorn's re-raise of the captured signal (which made a clean SIGTERM
exit with status -15): `serve` returns 0 after a clean drain and `EXIT_REQUESTS_CUT` when the graceful
timeout had to cut something: an HTTP connection, a gRPC call, or work that still ran. With several workers,
uvicorn's own supervisor runs the workers (see `serve`).

The end is bounded whatever runs: a request's work in a thread cannot be interrupted, only told to stop at its next
check (`posenc.service.request_kit.work`), and Python waits for every thread before it exits (asyncio's run for
the tasks awaiting them, the interpreter for the threads). Work still running once the connections are cut is named
in a WARNING and the process exits at once (`os._exit`), and a deadline (`BACKSTOP_MARGIN_SECONDS` after
POSENC_GRACEFUL_SHUTDOWN_TIMEOUT, counted from the start of the drain) ends it if anything else holds it: 40 audits
in threads used to keep a SIGTERMed process alive for minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Generator

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.server import HANDLED_SIGNALS

from posenc.service.http.listener import Listener
from posenc.service.http.logs import log_config
from posenc.service.http.protocol import DrainState, ServerConfig, TimeoutHttpToolsProtocol, Timeouts
from posenc.service.http.unix_socket import bind_unix_socket
from posenc.service.metrics import shared_metrics_dir
from posenc.service.request_kit import work
from posenc.service.settings import Settings

log = logging.getLogger("posenc.http.server")

EXIT_OK = 0
EXIT_REQUESTS_CUT = 1  # the graceful-shutdown timeout closed connections that still had a request in flight
EXIT_STARTUP_FAILURE = STARTUP_FAILURE  # 3: the port is taken, the app failed to start, ...

# After the signal, before the listeners close: one more pass of the event loop reads requests that were
# fully sent before the signal but not yet parsed, so they are answered instead of reset.
SETTLE_SECONDS = 0.05
# Connections the kernel completed before the signal but the loop has not accepted yet are reset when the
# listener closes: the loop gets up to this long to accept them (a burst on a busy machine) first.
BACKLOG_SECONDS = 1.0
# uvicorn's own drain deadline (tasks are cancelled after it) is a backstop behind the protocol's, which
# aborts the connections first so no cancelled task can write a 500 to a client. The process ends at the latest this
# long after POSENC_GRACEFUL_SHUTDOWN_TIMEOUT (counted from the start of the drain), whatever still runs.
BACKSTOP_MARGIN_SECONDS = 2.0
# After the connections are cut: how long their requests' tasks get to end (work told to stop ends at its next check:
# a row block, a stage of an audit) before what still runs is named and the process exits.
WORK_STOP_SECONDS = 0.5


class GrpcCuts:
    """The gRPC calls a drain cut: once the graceful timeout of `drain` has run out, gRPC cancels the calls still
    running and its clients get UNAVAILABLE; a call recorded from then on is one of them (`recorder`)."""

    def __init__(self) -> None:
        self.deadline: float | None = None  # time.monotonic() when the calls still running are cancelled
        self.grace = 0.0
        self.cut: list[str] = []

    def draining(self, grace: float) -> None:
        self.deadline, self.grace = time.monotonic() + grace, grace

    def recorder(self, record: Callable[[str, str, float, int, str], None]
                 ) -> Callable[[str, str, float, int, str], None]:
        """`record` (the access log and metrics of every gRPC call) that also notes, logs and counts the calls a drain
        cut; what they are recorded with is what their clients got, UNAVAILABLE."""

        def recorded(method: str, code: str, seconds: float, nbytes: int, peer: str) -> None:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.cut.append(f"gRPC {method} from {peer}")
                log.warning("graceful shutdown timeout (%g s, POSENC_GRACEFUL_SHUTDOWN_TIMEOUT): gRPC %s from %s cut "
                            "after %.1f s", self.grace, method, peer or "a client", seconds)
                code = "UNAVAILABLE"
            record(method, code, seconds, nbytes, peer)

        return recorded


GRPC_CUTS = GrpcCuts()  # this process's (`posenc.service.serving.process` records the gRPC calls through it)


class Server(uvicorn.Server):
    """One server process whose exit status says whether the drain after a signal was clean."""

    def __init__(self, config: ServerConfig, *, exit_when_stuck: bool = False) -> None:
        super().__init__(config)
        self.timeouts = config.timeouts
        self.server_state: DrainState = DrainState()
        self.cancelled_tasks = 0
        self.listeners: list[Listener] = []
        # `posenc serve`'s own process: work still running after the drain ends the process (`os._exit`)
        self.exit_when_stuck = exit_when_stuck

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's handlers (first SIGTERM/SIGINT: drain; second SIGINT: force), without its re-raise of the
        signal at the end, which made a clean stop exit with status -15."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, listening through `Listener`s (a batch of waiting connections accepted per loop
        iteration, where uvloop accepts one) on `sockets`, or on a socket bound to the configured host and port."""
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            return TimeoutHttpToolsProtocol(config, self.server_state, self.lifespan.state)

        if sockets is None:
            try:
                sockets = [config.bind_socket()]  # logs where it listens; exits with status 3 when it cannot
            except SystemExit:
                await self.lifespan.shutdown()
                raise
        loop = asyncio.get_running_loop()
        self.listeners = [Listener(sock, create_protocol, config.backlog, loop, self.timeouts.header)
                          for sock in sockets]
        self.servers = []
        self.started = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, reordered: settle (accepting what waits in the backlog), stop listening, drain
        within the deadline, then cut; work still running then ends the process (`exit_when_stuck`)."""
        if self.exit_when_stuck:
            _exit_deadline(self.timeouts.graceful_shutdown + BACKSTOP_MARGIN_SECONDS)
        await asyncio.sleep(SETTLE_SECONDS)
        if await self._accept_backlog():
            await asyncio.sleep(SETTLE_SECONDS)  # read the requests of the connections just accepted
        log.info("shutting down: waiting up to %g s for %d connection(s) (POSENC_GRACEFUL_SHUTDOWN_TIMEOUT)",
                 self.timeouts.graceful_shutdown, len(self.server_state.connections))
        for listener in self.listeners:
            listener.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # ours arm their cut timer
        # gRPC's calls drain beside HTTP's. Its module is loaded when a gRPC server runs; importing it here for
        # nothing took seconds of the drain on a busy machine (the event loop's GIL shared with working threads).
        grpc_server = sys.modules.get("posenc.service.grpc.server")
        if grpc_server is not None:
            GRPC_CUTS.draining(self.timeouts.graceful_shutdown)
            grpc_server.drain(self.timeouts.graceful_shutdown)
        loop = asyncio.get_running_loop()
        # the protocol cuts at the graceful timeout; the requests' tasks then get WORK_STOP_SECONDS to end
        deadline = loop.time() + min(self.config.timeout_graceful_shutdown or 0,
                                     self.timeouts.graceful_shutdown + WORK_STOP_SECONDS)
        state = self.server_state
        while (state.connections or state.tasks or work.IN_THREADS) and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(0.05)
        # Past the deadline (a task stuck after its connection was cut), or a forced exit (second
        # Ctrl+C): abort what is left first, so that no cancelled task can still write a 500 to a client.
        for connection in list(state.connections):
            if isinstance(connection, TimeoutHttpToolsProtocol) and connection.cut_timer is not None:
                connection.cut()
        if work.IN_THREADS and self.exit_when_stuck:
            # no cancellation reaches a thread: closing the app under it, then asyncio's and the interpreter's waits
            # for it, would hold the process until it ends
            _exit_now(f"{len(work.IN_THREADS)} call(s) still running in threads after the graceful shutdown timeout")
        if state.tasks:
            self.cancelled_tasks = len(state.tasks)
            log.error("cancelling %d request task(s) still running after the graceful shutdown", len(state.tasks))
            for task in state.tasks:
                task.cancel(msg="graceful shutdown timeout exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def _accept_backlog(self) -> bool:
        """Wait (at most `BACKLOG_SECONDS`) until no listener has a connection waiting to be accepted;
        whether there was one."""
        listeners = [sock.fileno() for listener in self.listeners for sock in listener.sockets]
        deadline = asyncio.get_running_loop().time() + BACKLOG_SECONDS
        waited = False
        while listeners and select.select(listeners, [], [], 0)[0]:  # readable listener = pending connection
            if asyncio.get_running_loop().time() >= deadline:
                break
            waited = True
            await asyncio.sleep(0.005)  # the loop's reader callback accepts them
        return waited

    @property
    def exit_status(self) -> int:
        if not self.started:
            return EXIT_STARTUP_FAILURE
        cut = self.server_state.cut_connections or self.cancelled_tasks or GRPC_CUTS.cut
        return EXIT_REQUESTS_CUT if cut else EXIT_OK


def _exit_now(why: str) -> None:
    """End the process with EXIT_REQUESTS_CUT now, after a WARNING naming the requests still running."""
    running = work.running()
    log.warning("exiting with status %d: %s%s", EXIT_REQUESTS_CUT, why,
                f" ({'; '.join(running)})" if running else "")
    for handler in logging.getLogger().handlers + logging.getLogger("posenc").handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(EXIT_REQUESTS_CUT)


def _exit_deadline(seconds: float) -> None:
    """End the process `seconds` from now if it is still there (a daemon thread: it never delays an exit)."""

    def wait() -> None:
        time.sleep(seconds)
        _exit_now(f"the process had not ended {seconds:g} s after its drain began (POSENC_GRACEFUL_SHUTDOWN_TIMEOUT + "
                  f"{BACKSTOP_MARGIN_SECONDS:g} s)")

    threading.Thread(target=wait, name="posenc-exit-deadline", daemon=True).start()


def build_config(settings: Settings) -> ServerConfig:
    """The uvicorn configuration of `posenc serve` (the app is built in each worker, from the environment)."""
    timeouts = Timeouts.from_settings(settings)
    return ServerConfig(
        "posenc.service.serving.process:app_from_env",
        timeouts=timeouts,
        max_header_bytes=settings.max_header_bytes,
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        http=TimeoutHttpToolsProtocol,
        log_level=settings.log_level,
        log_config=log_config(settings),
        access_log=False,  # the service writes its own access log (POSENC_ACCESS_LOG, POSENC_LOG_FORMAT)
        # Whole seconds for uvicorn; the protocol uses the exact values.
        timeout_keep_alive=math.ceil(timeouts.keep_alive),
        timeout_graceful_shutdown=math.ceil(timeouts.graceful_shutdown + BACKSTOP_MARGIN_SECONDS),
    )


def serve(settings: Settings) -> int:
    """Run the service until SIGTERM/SIGINT; the process exit status.

    One worker: `Server` in this process; 0 after a clean drain, `EXIT_REQUESTS_CUT` when the graceful
    timeout cut connections, `EXIT_STARTUP_FAILURE` when it could not start. Several workers: uvicorn's
    supervisor, which returns once every worker has stopped: 0 whatever the workers' status (they enforce the
    same timeouts; cut connections are in their log), `EXIT_STARTUP_FAILURE` when a worker could not start.
    The workers share one metrics directory, so `/metrics` reports totals over all of them.
    """
    config = build_config(settings)
    # With a Unix socket the server listens on both: uvicorn takes ready sockets instead of host and port.
    sockets = [config.bind_socket(), bind_unix_socket(settings.uds)] if settings.uds else None
    if config.workers > 1:
        from uvicorn.supervisors import Multiprocess

        supervisor = Multiprocess(config, sockets=sockets or [config.bind_socket()])
        with shared_metrics_dir():  # uvicorn spawns its workers: they import prometheus_client afresh
            supervisor.run()
        failed = any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes)
        return EXIT_STARTUP_FAILURE if failed else EXIT_OK
    server = Server(config, exit_when_stuck=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C before the signal handlers are installed
        server.run(sockets=sockets)
    return server.exit_status
