"""Service configuration: one pydantic-settings class, read from `POSENC_*` variables when built.

Nothing reads the environment at import time: `Settings()` is constructed by the CLI or the app
factory and passed into `create_app(settings)`.
"""

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from posenc.models.export.arguments import SOURCE_REPOSITORY
from posenc.service import audit_limits

MiB = 1024 * 1024
GiB = 1024 * MiB

# Triton's protocol groups (`--http-restricted-api`); posenc.service.request_kit.restricted maps each to its routes.
RESTRICTED_API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
                         "statistics", "trace", "logging")
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # an HTTP token


def parse_restricted_api(text: str) -> dict[str, tuple[str, str]]:
    """Triton's `GROUP[,GROUP...]:HEADER=VALUE` specs, several joined by `;`: group -> (header name in lower
    case, value). Raises ValueError naming what is wrong (a group twice, an unknown group, no `=`)."""
    restrictions: dict[str, tuple[str, str]] = {}
    for spec in filter(None, (part.strip() for part in text.split(";"))):
        groups, sep, pair = spec.partition(":")
        header, eq, value = pair.partition("=")
        if not (sep and eq and _HEADER_NAME.fullmatch(header.strip()) and value):
            raise ValueError("each restriction is GROUP[,GROUP...]:HEADER=VALUE (Triton's --http-restricted-api), "
                             "several separated by ';'")
        for group in (g.strip() for g in groups.split(",")):
            if group not in RESTRICTED_API_GROUPS:
                raise ValueError(f"unknown protocol group {group!r}; groups: {', '.join(RESTRICTED_API_GROUPS)}")
            if group in restrictions:
                raise ValueError(f"protocol group {group!r} is restricted twice")
            restrictions[group] = (header.strip().lower(), value)
    return restrictions



def usable_cores() -> int:
    """CPUs this process may run on: what a thread-count setting of 0 means."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def shipped_model_repository() -> Path:
    """The models posenc ships: package data of an installed wheel (`service/shipped_models`, built from
    onnx/), or onnx/ of a source checkout (editable installs, the repository itself)."""
    packaged = Path(__file__).resolve().parent / "shipped_models"
    if packaged.is_dir() or SOURCE_REPOSITORY is None:
        return packaged
    return SOURCE_REPOSITORY


class Settings(BaseSettings):
    """Every knob of the service; the env variable is `POSENC_<FIELD NAME IN UPPER CASE>`."""

    # protected_namespaces: older pydantic-settings reserve every `model_` name, and `model_repository` is ours.
    # hide_input_in_errors: a rejected value may be a secret (POSENC_RESTRICTED_API); `settings_or_exit` shows
    # the others itself.
    model_config = SettingsConfigDict(env_prefix="POSENC_", extra="ignore", frozen=True,
                                      protected_namespaces=("settings_",), hide_input_in_errors=True)

    host: str = Field("127.0.0.1", description="Address `posenc serve` binds to.")
    port: int = Field(8000, ge=1, le=65535, description="Port `posenc serve` listens on.")
    workers: int = Field(1, ge=1, le=64, description="Worker processes for `posenc serve`.")
    grpc_port: int = Field(
        8001, ge=0, le=65535,
        description="Port of the KServe v2 / Triton gRPC service (`inference.GRPCInferenceService`, health, "
        "reflection) that `posenc serve` runs beside HTTP on the same host, engine and limits; 0 = no gRPC.",
    )
    grpc_max_concurrent_rpcs: int = Field(
        256, ge=1, le=100_000,
        description="gRPC calls (a stream counts once) served at once per worker; one more unary call is refused "
        "with RESOURCE_EXHAUSTED, one more stream waits, unread (64 KiB of it in gRPC core). Streams hold at most "
        "three quarters of it (the rest stays for unary calls); health and metadata calls are never refused.",
    )
    grpc_stream_idle_seconds: float = Field(
        30.0, gt=0, le=3600,
        description="A gRPC stream (ModelStreamInfer) that sends no request for this many seconds while none of its "
        "requests is in progress is ended with DEADLINE_EXCEEDED, and its place goes to the next call.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as plain text, or one JSON object per line (access log included)."
    )
    access_log: bool = Field(True, description="Log one line per HTTP request (method, route, status, duration).")

    max_table_bytes: int = Field(
        256 * MiB, ge=1, description="Largest table response in bytes (computed before allocating); over it: 413."
    )
    max_json_elements: int = Field(
        1 << 20, ge=1, description="Largest number of elements served as `format=json`; over it: 413."
    )
    max_png_pixels: int = Field(
        1 << 22, ge=1,
        description="Largest number of table elements drawn as `format=png` (one cell each); over it: 413.",
    )
    cache_bytes: int = Field(
        256 * MiB, ge=0, description="Byte budget of the in-memory LRU cache of encoded table responses (0 = off)."
    )
    memory_budget_bytes: int = Field(
        1024 * MiB, ge=MiB,
        description="Memory that table computations, uploads and inference requests in flight may hold together "
        "(estimated before allocating); requests that do not fit wait (see memory_wait_seconds).",
    )
    memory_wait_seconds: float = Field(
        10.0, ge=0, le=600,
        description="How long a request waits for memory_budget_bytes to come free before a 503 with Retry-After.",
    )
    memory_waiters: int = Field(
        64, ge=0, le=100_000, description="Requests that may wait for memory at once; one more gets a 503 at once."
    )
    malloc_arenas: int = Field(
        2, ge=0, le=64,
        description="glibc malloc heaps (M_ARENA_MAX) set at start-up; fewer heaps strand less freed memory. "
        "0 leaves glibc's default (8 per core).",
    )
    malloc_keep_bytes: int = Field(
        64 * MiB, ge=0, le=GiB,
        description="Freed memory each glibc heap keeps for the next allocation instead of handing it back at "
        "once (M_TRIM_THRESHOLD; allocations below half of it, at most 32 MiB, come from the heaps), set at "
        "start-up: tables computed in row blocks reuse their temporaries' pages, and the copies of an inference "
        "body of tens of MB (gRPC's message, the response) reuse freed pages instead of faulting fresh ones in. "
        "Large requests still hand freed memory back when they end. 0 leaves glibc's defaults.",
    )
    table_threads: int = Field(
        0, ge=0, le=1024,
        description="Threads that compute large uncached tables in row blocks (numpy releases the GIL), shared by "
        "all requests; 0 = one per CPU core of this process.",
    )
    table_block_bytes: int = Field(
        MiB, ge=0, le=GiB,
        description="Output bytes per row block of a table computed in blocks; a table of at most one block, or "
        "a family without row blocks, is computed in one piece. 0 = every table in one piece, on one core.",
    )
    max_request_bytes: int = Field(
        64 * MiB, ge=1, description="Largest request body accepted (uploads, inference); over it: 413."
    )
    audit_max_header_bytes: int = Field(
        audit_limits.MAX_HEADER_BYTES, ge=audit_limits.FLOOR_BYTES,
        description="POST /v1/audit: largest GGUF or safetensors header read (metadata, "
        "vocabulary); the tensors after it are skipped as the upload streams by, whatever its size.",
    )
    audit_max_onnx_bytes: int = Field(
        audit_limits.MAX_ONNX_BYTES, ge=audit_limits.FLOOR_BYTES,
        description="POST /v1/audit: largest ONNX or JSON upload (held whole to parse); larger "
        "models are audited by `posenc audit`, which can send only the extract (`--remote`).",
    )
    model_repository: Path = Field(
        default_factory=shipped_model_repository,
        description="Folder of `<model>/model.onnx` + `<model>/config.json`; default: the shipped models.",
    )

    # Inference (KServe v2): onnxruntime sessions and the per-model micro-batcher.
    providers: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="onnxruntime execution providers: cpu; cuda (model not ready without a CUDA device); "
        "auto = CUDA when onnxruntime-gpu sees a device, else CPU.",
    )
    intra_op_num_threads: int = Field(
        0, ge=0, le=1024,
        description="onnxruntime intra-op threads per session; 0 = one per CPU core of this process "
        "(resolved at start-up and set explicitly on the session).",
    )
    cpu_form_from: str = Field(
        "calibrate", pattern=r"^(calibrate|config|never|[1-9][0-9]{0,8})$",
        description="Which of a model's CPU graphs (model.onnx and its CPU forms: model.cpu.onnx, "
        "model.blocked<N>.onnx) runs each sequence length: `calibrate` = the fastest measured on this machine at "
        "start-up (in a child process, beside serving: the model is not ready until it is chosen; cached: "
        "POSENC_CALIBRATION_CACHE, or known: POSENC_CALIBRATION_RULES); `config` = config.json's cpu_rule (measured "
        "where the model was exported); `never` = model.onnx only; a number N = model.cpu.onnx from N on, "
        "model.onnx below, for every model.",
    )
    calibration_seconds: float = Field(
        30.0, ge=0, le=3600,
        description="Start-up time the CPU-form calibration may take for all models together; a model it cannot "
        "finish keeps config.json's rule (not cached).",
    )
    calibration_cache: str = Field(
        "", description="JSON file of calibrated rules, by CPU, ISA, cores, onnxruntime version, threads and model "
        "hashes; empty = $XDG_CACHE_HOME/posenc/calibration.json (~/.cache/...); `off` = measure at every start. "
        "Used only when the file and its folder are the server user's (or root's, read only) and writable by no one "
        "else (the folder is created 0700, the file written 0600), within 1 MiB, 1024 entries and 64 rule steps; "
        "else measured again (logged once).",
    )
    calibration_rules: str = Field(
        "", description="A read-only JSON file of calibrated rules in the cache's format (`posenc calibrate "
        "--print`), read before POSENC_CALIBRATION_CACHE and never written: a cluster measures once per node "
        "type and mounts the file in every pod (a ConfigMap: docs/deployment.md); empty = none.",
    )
    inference_threads: int = Field(
        4, ge=1, le=256, description="Worker threads that call onnxruntime `run` (it releases the GIL)."
    )
    inline_run_us: int = Field(
        2000, ge=0, le=1_000_000,
        description="A model run whose shape last ran in less than this (microseconds) runs on the event loop instead "
        "of a worker thread: the hand-off to a thread and back costs about as much as such a run. 0: always a worker "
        "thread.",
    )
    server_timing: bool = Field(
        False,
        description="Answer every inference with where its time went on the server: a `Server-Timing` header over "
        "HTTP (route, admit, read, parse, queue, run, encode, total; milliseconds), `server-timing` trailing "
        "metadata over gRPC (parse, queue, run, encode, total).",
    )
    batching: bool = Field(
        True, description="Dynamic batching per model; false runs every request on its own (still in a worker thread)."
    )
    batch_below_us: int = Field(
        1500, ge=0, le=1_000_000_000,
        description="On the CPU, queued requests are batched only while the oldest one's rows take less than this to "
        "run (microseconds), at the cost per row of the last run of its shape, batched or not: a batch saves each "
        "run's fixed cost, and a longer run has little of it to save (rope_attention at S=256 costs 15-30% more "
        "per row in a batch than alone). 0: no bound (a GPU has none). Below it, a batch forms only where the "
        "fastest batch of its size has cost less per row than the fastest run alone.",
    )
    max_batch_size: int | None = Field(
        None, ge=1, le=4096,
        description="Override of every model's config.json `max_batch_size` (rows per onnxruntime run).",
    )
    max_queue_delay_us: int = Field(
        0, ge=0, le=10_000_000,
        description="How long the first request of a batch waits for a full batch (microseconds). 0: a request that "
        "finds its model idle runs at once; batches form from the requests queued while a run is in flight.",
    )
    max_run_bytes: int = Field(
        0, ge=0,
        description="Memory one onnxruntime run's attention scores may take (B·Hq·S² float32 scores and softmax); "
        "a request whose single row needs more: 413 naming the longest sequence that fits; batches and concurrent "
        "runs stay under it together. 0 = from the provider at start-up: 1/4 of the CUDA device's memory, or 1/4 "
        "of this process's RAM (cgroup limit) on CPU.",
    )
    cuda_arena_bytes: int = Field(
        0, ge=0,
        description="Cap of onnxruntime's CUDA memory arena per session (`gpu_mem_limit`; it grows only as requested). "
        "0 = 3/4 of the device's memory.",
    )
    cuda_pin_shared_memory: bool = Field(
        True,
        description="On CUDA, page-lock (cudaHostRegister) the shared-memory regions the server maps (sealed memfds) "
        "while they are registered: inputs go to the device and outputs come back by DMA, one copy each, "
        "instead of through the driver's staging buffer. The locked bytes are bounded by "
        "POSENC_SHARED_MEMORY_MAX_BYTES.",
    )
    shared_memory: bool = Field(
        False,
        description="Triton/KServe system shared-memory extension: clients on this host may register POSIX "
        "shared-memory regions and pass tensors through them instead of the socket: over the Unix socket "
        "(`POSENC_UDS`), or over TCP with the `shared-memory` key of `POSENC_RESTRICTED_API`.",
    )
    restricted_api: SecretStr | None = Field(
        None,
        description="Protocol groups a request may use only with a header, in Triton's syntax: "
        "`GROUP[,GROUP...]:HEADER=VALUE`, several separated by `;` (groups: " + ", ".join(RESTRICTED_API_GROUPS)
        + "). A request without the header gets 403. Over TCP, shared memory (registering regions and naming "
        "them in infer requests) is refused unless the `shared-memory` group is restricted here and the header "
        "is sent.",
    )
    uds: Path | None = Field(
        None,
        description="Also listen on this Unix-domain socket (`posenc serve` replaces a stale socket file). The "
        "server learns each peer's uid and groups from the socket (SO_PEERCRED) and registers a shared-memory "
        "object for it only if that peer could open the object itself with the access the region needs.",
    )
    shared_memory_max_bytes: int = Field(
        16 * GiB, ge=1, le=1 << 50,
        description="Total bytes of all registered shared-memory regions; a register past it gets 413.",
    )
    max_queue_size: int = Field(
        256, ge=1, le=1_000_000,
        description="Requests waiting per model; one more gets 503 with Retry-After.",
    )

    # Connection limits and shutdown (`posenc serve`; see docs/operations.md "Limits and timeouts").
    timeout_keep_alive: float = Field(
        5.0, gt=0, le=3600, description="Seconds an idle kept-alive connection stays open between two requests."
    )
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, le=16 * MiB,
        description="Largest request head (request line and headers) in bytes; a longer one gets 431 and the "
        "connection is closed before the rest is read.",
    )
    header_timeout: float = Field(
        10.0, gt=0, le=3600,
        description="Seconds from connection open (or the end of the previous response) until the request head "
        "must be complete; otherwise the connection is closed.",
    )
    body_timeout: float = Field(
        30.0, gt=0, le=3600,
        description="Longest gap in seconds between two chunks of a request body; longer: 408 and the connection "
        "is closed.",
    )
    send_timeout: float = Field(
        30.0, gt=0, le=3600,
        description="Longest time in seconds a response may wait for the client to read it (the connection's "
        "write buffer full); longer: the connection is cut and posenc_send_timeouts_total counts it.",
    )
    graceful_shutdown_timeout: float = Field(
        30.0, ge=0, le=3600,
        description="Seconds requests in flight get after SIGTERM/SIGINT before their connections are closed "
        "(the exit status is then 1).",
    )

    @field_validator("restricted_api")
    @classmethod
    def _restricted_api_syntax(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            parse_restricted_api(value.get_secret_value())  # a ValueError names the mistake, never the value
        return value

    def restrictions(self) -> dict[str, tuple[str, str]]:
        """POSENC_RESTRICTED_API parsed: protocol group -> (header name, value)."""
        return parse_restricted_api(self.restricted_api.get_secret_value()) if self.restricted_api else {}


# Settings whose value is a secret: never repeated in a log or an error.
SECRET_SETTINGS = frozenset(name for name, field in Settings.model_fields.items()
                            if "SecretStr" in str(field.annotation))
