"""Where the model repository's onnxruntime sessions are made, and, in a test process, shared between apps.

A server makes one engine, so each session once. A test process makes an app per test (`posenc_app`, this
repository's own `running_client`), and each app's engine would build every session of every model again:
about 0.2 s per app for the shipped models (30 sessions: each model's graph and its CPU forms), most of the
time of a test that asks for one table. After `share_sessions()`, a session of the same model bytes, session
options and providers is made once in the process and handed to every engine that asks for it. Sharing is
safe: a session does not change once made, and onnxruntime runs one session from several threads at once.
A model whose bytes change gets a new session (the key holds their sha256); the least recently used
sessions beyond `limit` are dropped from the cache (the engines holding them keep them).
"""

from __future__ import annotations

import collections
import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import onnxruntime as ort

Providers = Sequence[str | tuple[str, dict[str, str]]]
SessionKey = tuple[bytes, tuple[object, ...], str]

# The options the repository sets or could read back, and the session config entries it sets: what tells two
# sessions of the same bytes apart.
OPTION_FIELDS = ("intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
                 "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse")
CONFIG_ENTRIES = ("session.intra_op.allow_spinning",)

_lock = threading.Lock()
_shared: collections.OrderedDict[SessionKey, ort.InferenceSession] | None = None
_limit = 0


def session_options(threads: int) -> ort.SessionOptions:
    """The options of every session the service runs, and of the calibration that times them: `threads` intra-op
    threads that never spin, and one inter-op thread (the graph is a chain of fused nodes: nothing to overlap).
    Idle intra-op threads would spin and steal CPU from the event loop and other models. onnxruntime's CPU arena
    stays on (without it each large run faults its buffers' pages in again: 1.1-1.5 × the time of a run at
    S=512-1024); what the arenas keep is handed back once a model is idle (`posenc.service.inference.runtime.arena`)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def share_sessions(limit: int = 256) -> None:
    """From now on, share sessions between the engines of this process (at most `limit` kept for sharing)."""
    global _shared, _limit
    with _lock:
        if _shared is None:
            _shared = collections.OrderedDict()
        _limit = limit


def stop_sharing() -> None:
    """Make every session anew again, and forget the shared ones."""
    global _shared
    with _lock:
        _shared = None


def new_session(model_bytes: bytes, options: ort.SessionOptions, providers: Providers) -> ort.InferenceSession:
    """An onnxruntime session of `model_bytes` (a shared one where `share_sessions` was called and one exists)."""
    if _shared is None:
        return ort.InferenceSession(model_bytes, sess_options=options, providers=list(providers))
    key = session_key(model_bytes, options, providers)
    with _lock:
        if _shared is not None and key in _shared:
            _shared.move_to_end(key)
            return _shared[key]
    session = ort.InferenceSession(model_bytes, sess_options=options, providers=list(providers))  # errors: not kept
    with _lock:
        if _shared is not None:
            session = _shared.setdefault(key, session)  # another thread may have made it meanwhile
            _shared.move_to_end(key)
            while len(_shared) > _limit:
                _shared.popitem(last=False)
    return session


def session_key(model_bytes: bytes, options: ort.SessionOptions, providers: Providers) -> SessionKey:
    """What makes two sessions interchangeable: the model's bytes, the session options, the providers (with their
    options)."""
    fields: list[Any] = [str(getattr(options, name)) for name in OPTION_FIELDS]
    fields += [_config_entry(options, entry) for entry in CONFIG_ENTRIES]
    return hashlib.sha256(model_bytes).digest(), tuple(fields), repr(list(providers))


def _config_entry(options: ort.SessionOptions, name: str) -> str | None:
    try:
        return str(options.get_session_config_entry(name))
    except RuntimeError:  # not set ("SessionOptions does not have configuration with key: ...")
        return None
