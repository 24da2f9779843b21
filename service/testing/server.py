"""`posenc serve` (or another ASGI server command) in a subprocess on loopback, for tests, benchmarks and scripts.

One class for every caller: settings as a mapping of `POSENC_*` values (or Settings field names), extra
arguments and environment, a free loopback port unless one is given, readiness by polling a path, the
output in a log file, and a stop by PID: a signal, then SIGKILL (of the whole process group: workers too)
after a bound.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import posenc
from posenc.service.testing.http import http_request
from posenc.service.testing.ports import LOOPBACK, free_port, require_loopback

SOURCE_ROOT = Path(posenc.__file__).resolve().parent.parent  # what holds the `posenc` package
# A port `free_port` chose may be taken by another process before the server binds it (two test workers starting
# servers at once: one's gRPC port was the other's HTTP port, and the other's readiness probe read HTTP/2). A server
# on chosen ports that exits for a port in use is started again on fresh ones, this many times at most.
PORT_ATTEMPTS = 3
PORT_IN_USE = ("address already in use", "grpc cannot listen on")  # in the log (lower case) of one that cannot bind


def setting_variable(name: str) -> str:
    """`POSENC_MAX_QUEUE_DELAY_US` for `max_queue_delay_us` (a name already spelled as a variable stays)."""
    return name if name.startswith("POSENC_") else f"POSENC_{name.upper()}"


def setting_value(value: object) -> str:
    """A setting as its environment value: booleans as `true`/`false`, anything else as `str()`."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def serve_command(*args: str) -> list[str]:
    """`python -m posenc.service.cli serve ARGS` with this interpreter."""
    return [sys.executable, "-m", "posenc.service.cli", "serve", *args]


def serve_env(settings: Mapping[str, object] | None = None, *, base: Mapping[str, str] | None = None,
              env: Mapping[str, str] | None = None, pythonpath: Sequence[str | Path] | None = None) -> dict[str, str]:
    """The environment of a server: `base` (default: this process's), then `env`, then the settings as
    `POSENC_*`; PYTHONPATH starts with `pythonpath` (default: the source root of this `service`, so the
    server runs the code the caller imported)."""
    out = dict(os.environ if base is None else base)
    out.update(env or {})
    out.update({setting_variable(k): setting_value(v) for k, v in (settings or {}).items()})
    paths = [str(p) for p in ([SOURCE_ROOT] if pythonpath is None else pythonpath)]
    if out.get("PYTHONPATH"):
        paths.append(out["PYTHONPATH"])
    if paths:
        out["PYTHONPATH"] = os.pathsep.join(paths)
    return out


def without_posenc(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) less every `POSENC_*` variable: a server with the defaults."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if not k.startswith("POSENC_")}


def kill_group(pid: int) -> None:
    """SIGKILL the process group `pid` leads (a server started here leads its own: its workers go too)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


class ServerProcess:
    """A server subprocess on `host:port` (loopback); a context manager that starts it and stops it.

    `command` defaults to `posenc serve`; its parts may hold `{host}` and `{port}` (e.g. a bare uvicorn app).
    POSENC_HOST and POSENC_PORT are always set to the server's; POSENC_GRPC_PORT to 0 (no gRPC) unless `grpc`
    (a free port of its own: `grpc_port`, `grpc_address`), the base environment or the settings say
    otherwise. `ready`: the path
    polled until it answers 200 (None: do not wait). The process gets its own session, so a Ctrl-C meant for
    the caller does not reach it: only `stop` (or `send_signal`) does.
    """

    def __init__(self, settings: Mapping[str, object] | None = None, *, args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, base_env: Mapping[str, str] | None = None,
                 command: Sequence[str] | None = None, host: str = LOOPBACK, port: int | None = None,
                 ready: str | None = "/readyz", ready_timeout: float = 90.0, stop_timeout: float = 15.0,
                 cwd: str | Path | None = None, log_path: str | Path | None = None,
                 pythonpath: Sequence[str | Path] | None = None, name: str = "posenc serve",
                 grpc: bool = False) -> None:
        self.host, self.name = require_loopback(host), name
        self.ready, self.ready_timeout, self.stop_timeout = ready, ready_timeout, stop_timeout
        self._command = [*(command if command is not None else serve_command()), *args]
        # No gRPC unless asked for (`grpc=True`: on a free port of its own) or set in the base environment, so
        # servers never share port 8001.
        base = os.environ if base_env is None else base_env
        grpc_env = {"POSENC_GRPC_PORT": "0"}
        if not grpc and "POSENC_GRPC_PORT" in base:
            grpc_env = {}
        self.env = serve_env(settings, base=base_env, pythonpath=pythonpath,
                             env={**grpc_env, **(env or {}), "POSENC_HOST": host})
        # ports this object chose (a caller's own are never changed): chosen again when another process took them
        self._chosen = (port is None, grpc and "POSENC_GRPC_PORT" not in (env or {}))
        self._place(port if port is not None else free_port(host),
                    free_port(host) if self._chosen[1] else int(self.env.get("POSENC_GRPC_PORT", "0") or 0))
        self.cwd = cwd
        self._own_log = log_path is None
        self.log_path = self._new_log() if log_path is None else Path(log_path)
        self._log_text: str | None = None
        self._signalled = False
        self.proc: subprocess.Popen[bytes] | None = None

    def _place(self, port: int, grpc_port: int) -> None:
        """The server's ports: its command line and environment say them."""
        self.port, self.grpc_port = port, grpc_port
        self.argv = [part.replace("{host}", self.host).replace("{port}", str(port)) for part in self._command]
        self.env["POSENC_PORT"], self.env["POSENC_GRPC_PORT"] = str(port), str(grpc_port)

    def _new_log(self) -> Path:
        fd, path = tempfile.mkstemp(prefix=f"posenc-server-{self.port}-", suffix=".log")
        os.close(fd)
        return Path(path)

    # -- where it is

    @property
    def address(self) -> str:
        """`host:port` (what tritonclient takes)."""
        return f"{self.host}:{self.port}"

    @property
    def grpc_address(self) -> str:
        """`host:port` of its gRPC service (started with `grpc=True`)."""
        return f"{self.host}:{self.grpc_port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self._started().pid

    # -- life cycle

    def start(self) -> ServerProcess:
        """Start the process; wait for `ready` (a failure stops it and raises RuntimeError with the log's tail)."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} was started already")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            if self.ready is None:
                return self
            try:
                self.wait_ready()
                return self
            except RuntimeError:
                taken = self.proc.poll() is not None and any(sign in self.log().lower() for sign in PORT_IN_USE)
                self.stop(signal.SIGKILL)
                if not (taken and any(self._chosen)) or attempt == PORT_ATTEMPTS:
                    raise
            except BaseException:
                self.stop(signal.SIGKILL)
                raise
            # another process took a port this object chose: fresh ones, a fresh log
            self._place(free_port(self.host) if self._chosen[0] else self.port,
                        free_port(self.host) if self._chosen[1] else self.grpc_port)
            if self._own_log:
                self.log_path = self._new_log()
            self.proc, self._signalled, self._log_text = None, False, None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def wait_ready(self, path: str | None = None, timeout: float | None = None) -> None:
        """Poll `path` (default: `ready`) until it answers 200; RuntimeError if the process ends or time runs out."""
        proc, path = self._started(), path or self.ready or "/healthz"
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        while True:
            try:
                # a 200 from a process that has ended is another server's on a port it took first
                if http_request(self.port, path, timeout=5, host=self.host)[0] == 200 and proc.poll() is None:
                    return
            except (OSError, http.client.HTTPException):  # not listening yet, or another server's port (HTTP/2)
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited with {proc.returncode}" if proc.returncode is not None else "timed out"
                raise RuntimeError(f"{self.name} on port {self.port} not ready on {path} ({state}); log tail:\n"
                                   f"{self.log()[-3000:]}")
            time.sleep(0.1)

    def poll(self) -> int | None:
        return self._started().poll()

    def send_signal(self, sig: int) -> None:
        """Signal the server's own process (its workers get it from there)."""
        proc = self._started()
        if proc.poll() is None:
            proc.send_signal(sig)
            self._signalled = True

    def terminate(self) -> None:
        """SIGTERM without waiting (stop several servers at once: terminate each, then `stop` each)."""
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; subprocess.TimeoutExpired after `timeout` seconds."""
        return self._started().wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float | None = None) -> int | None:
        """Signal it (unless signalled already), wait up to `timeout` (default `stop_timeout`), then SIGKILL its
        process group; keep the log's text. The exit status (None: it never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None and not self._signalled:
            self.send_signal(sig)
        try:
            self.proc.wait(self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc.pid)
            self.proc.wait()
        if self._own_log and self.log_path.exists():
            self._log_text = self.log_path.read_text(errors="replace")
            self.log_path.unlink()
        return self.proc.returncode

    def log(self) -> str:
        """Everything the server wrote (stdout and stderr) so far."""
        if self._log_text is not None:
            return self._log_text
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> ServerProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _started(self) -> subprocess.Popen[bytes]:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.proc
