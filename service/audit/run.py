"""One audit, from a local file (`posenc audit`) or an upload (`POST /v1/audit`): the file read within bounds by
the reader of its format (`readers.read`, one dispatch for both), the reference chosen, the facts judged
(`posenc.models.audit`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from posenc.models.audit.found import Found
from posenc.models.audit.layers import audit_model
from posenc.models.audit.reference import (
    Reference,
    applicable,
    from_config,
    from_preset,
    from_repository_config,
    match_catalogue,
    with_layer_type,
)
from posenc.models.audit.rope_audit import Audit
from posenc.models.errors import ParameterError
from posenc.service.audit import config_reader, readers
from posenc.service.audit.stream import FileSource, InThread, UploadSource, open_regular
from posenc.service.audit_limits import AuditBounds
from posenc.service.errors import BadRequest
from posenc.service.request_kit import work

T = TypeVar("T")


def read_path(path: Path, settings: AuditBounds) -> Found:
    """A local file's facts (`posenc audit`), through the one dispatch (`readers.read`): GGUF and safetensors read
    by seeking (header, then the few tensors), ONNX loaded without its external data, JSON whole; ONNX and JSON
    within the bound of uploads (`audit_max_onnx_bytes`), regular files only (`stream.open_regular`)."""
    try:
        with open_regular(path) as handle:
            return _never_waits(readers.read(FileSource(handle, path, settings.audit_max_header_bytes,
                                                        settings.audit_max_onnx_bytes)))
    except OSError as exc:
        raise BadRequest(f"cannot read {path}: {exc.strerror}") from None


def _never_waits(reading: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine that never suspends (a `FileSource`'s reads and parses are plain calls): the
    command needs no event loop, nor asyncio's import."""
    try:
        reading.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    reading.close()
    raise RuntimeError("a local file's reader waited on something")


async def read_upload(chunks: AsyncIterator[bytes], size: int | None, settings: AuditBounds,
                      in_thread: InThread | None = None) -> Found:
    """An upload's facts (`POST /v1/audit`, `size`: its Content-Length), through the same dispatch: GGUF and
    safetensors streamed (header, then only the named ranges; the header parsed in a worker thread), the rest read
    whole within `audit_max_onnx_bytes` and parsed in a worker thread (`in_thread`, default anyio's threads; the
    event loop answers meanwhile)."""
    return await readers.read(UploadSource(chunks, size, settings.audit_max_header_bytes,
                                           settings.audit_max_onnx_bytes, in_thread))


def reference(found: Found, preset: str | None, config: Mapping[str, Any] | None) -> Reference:
    """The named preset, the given config (a Hugging Face config.json or a posenc repository config.json), or the
    catalogue's match. A named one the audit cannot judge by (its RoPE does not build, or it states no position
    handling the audit judges) is a ParameterError (`applicable`: exit status 2, HTTP 422), never a silent fallback
    to the file's internal consistency."""
    if preset is not None and config is not None:
        raise BadRequest("give either a preset or a config, not both")
    if preset is not None:
        try:
            named = from_preset(preset)
        except ParameterError as exc:  # an unknown preset
            raise BadRequest(str(exc)) from None
        return applicable(named)
    if config is not None:
        if "rope" in config and "attention" in config:
            return from_repository_config(config)
        config_reader.layer_types(config, "the given config.json")  # bounded before each is resolved
        return applicable(from_config(config, "config", "the given config.json"))
    return match_catalogue(found)


def parse_config(text: str | bytes | None) -> Mapping[str, Any] | None:
    """`?config=` (`--config`): a JSON object counted within config_reader's limits before it is parsed."""
    return None if text is None else config_reader.parse(text, "config")


def run(found: Found, preset: str | None, config: Mapping[str, Any] | None, layer_type: str | None = None) -> Audit:
    """`found` judged against its reference: every layer type the reference has a RoPE for, or `layer_type` alone
    (ParameterError, a 422, when the model has no such layer type)."""
    ref = reference(found, preset, config)
    work.check()  # a request whose client left stops here, before the judging and its tables
    return audit_model(found, ref if layer_type is None else with_layer_type(ref, layer_type))
