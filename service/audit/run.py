"""One audit, from a local file (`posenc audit`) or an upload (`POST /v1/audit`): the format told by the first
bytes, the file read within bounds, the reference chosen, the facts judged (`posenc.models.audit`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from posenc.models.audit.found import Found
from posenc.models.audit.reference import Reference, from_config, from_preset, from_repository_config, match_catalogue
from posenc.models.audit.rope_audit import Audit, audit
from posenc.models.errors import ParameterError
from posenc.service.audit import config_reader, extract, gguf_reader, onnx_reader, safetensors_reader
from posenc.service.audit.stream import read_file, read_stream
from posenc.service.errors import BadRequest, PayloadTooLarge, format_bytes
from posenc.service.settings import Settings

KINDS = ("gguf", "safetensors", "onnx", "config", "extract")
STREAMED = {"gguf": gguf_reader, "safetensors": safetensors_reader}


def detect(prefix: bytes) -> str:
    """The format of a file from its first bytes: GGUF magic, a safetensors header length then '{', JSON
    (an extract or a config.json), else an ONNX protobuf."""
    if prefix[:4] == b"GGUF":
        return "gguf"
    if len(prefix) >= 9 and prefix[8:9] == b"{":
        return "safetensors"
    if prefix.lstrip()[:1] == b"{":
        return "json"
    return "onnx"


def _json_found(body: bytes) -> Found:
    document = config_reader.parse(body, "JSON upload")
    if extract.MARK in document:
        return extract.load(document)
    return config_reader.to_found(document)


def read_path(path: Path, settings: Settings) -> Found:
    """A local file's facts: GGUF and safetensors read by seeking (header, then the few tensors), ONNX loaded
    without its external data, JSON whole."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            kind = detect(handle.read(16))
            if kind in STREAMED:
                reader = STREAMED[kind]
                header, tensors = read_file(handle, size, reader.parse_header, settings.audit_max_header_bytes,
                                            f"{kind.upper() if kind == 'gguf' else kind} file")
                return reader.to_found(header, tensors)
            if kind == "json":
                handle.seek(0)
                return _json_found(handle.read(settings.audit_max_onnx_bytes + 1)[: settings.audit_max_onnx_bytes])
    except OSError as exc:
        raise BadRequest(f"cannot read {path}: {exc.strerror}") from None
    return onnx_reader.to_found(onnx_reader.load(path=path), path.parent)


async def read_upload(chunks: AsyncIterator[bytes], size: int | None, settings: Settings) -> Found:
    """An upload's facts: GGUF and safetensors streamed (header, then only the named ranges; the header parsed in
    a worker thread), the rest read whole within `audit_max_onnx_bytes` and parsed in a worker thread (the event
    loop answers meanwhile)."""
    first = b""
    while len(first) < 16:
        try:
            first += await chunks.__anext__()
        except StopAsyncIteration:
            break
    kind = detect(first)

    async def replay() -> AsyncIterator[bytes]:
        yield first
        async for chunk in chunks:
            yield chunk

    stream = replay()
    if kind in STREAMED:
        reader = STREAMED[kind]
        header, tensors = await read_stream(stream, size, reader.parse_header, settings.audit_max_header_bytes,
                                            f"{kind} upload")
        return reader.to_found(header, tensors)
    limit = settings.audit_max_onnx_bytes
    if size is not None and size > limit:
        raise PayloadTooLarge(f"a {kind} upload of {format_bytes(size)} is over POSENC_AUDIT_MAX_ONNX_BYTES "
                              f"({format_bytes(limit)}); audit it with `posenc audit FILE --remote URL`, which "
                              "sends only the extract")
    body = bytearray()
    async for chunk in stream:
        body += chunk
        if len(body) > limit:
            raise PayloadTooLarge(f"a {kind} upload over {format_bytes(limit)} (POSENC_AUDIT_MAX_ONNX_BYTES); "
                                  "audit it with `posenc audit FILE --remote URL`, which sends only the extract")
    data = bytes(body)
    del body  # one copy held while it is parsed
    from starlette.concurrency import run_in_threadpool  # the server's threads: the CLI never comes here
    return await run_in_threadpool(_whole_found, kind, data)  # parsed off the event loop


def _whole_found(kind: str, body: bytes) -> Found:
    """The facts of an upload read whole: a JSON document, or an ONNX model (counted, loaded and scanned)."""
    if kind == "json":
        return _json_found(body)
    return onnx_reader.to_found(onnx_reader.load(data=body))


def reference(found: Found, preset: str | None, config: Mapping[str, Any] | None) -> Reference:
    """The named preset, the given config (a Hugging Face config.json or a posenc repository config.json), or the
    catalogue's match."""
    if preset is not None and config is not None:
        raise BadRequest("give either a preset or a config, not both")
    try:
        if preset is not None:
            return from_preset(preset)
    except ParameterError as exc:
        raise BadRequest(str(exc)) from None
    if config is not None:
        if "rope" in config and "attention" in config:
            return from_repository_config(config)
        return from_config(config, "config", "the given config.json")
    sizes = {"hidden_size": found.hidden_size, "num_heads": found.num_heads, "head_dim": found.head_dim}
    return match_catalogue(found.architecture, sizes, found.context_length)


def parse_config(text: str | bytes | None) -> Mapping[str, Any] | None:
    """`?config=` (`--config`): a JSON object counted within config_reader's limits before it is parsed."""
    return None if text is None else config_reader.parse(text, "config")


def run(found: Found, preset: str | None, config: Mapping[str, Any] | None) -> Audit:
    return audit(found, reference(found, preset, config))
