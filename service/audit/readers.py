"""The audit's readers, one per format, and the one dispatch to them: `posenc audit FILE` and `POST /v1/audit` both
come through `read`.

A reader (`Reader`) takes a bounded source (`stream.Source`: a local file or a request body) and returns the facts
the file states (`Found`, what the extract carries). GGUF and safetensors are read as a header, then the few byte
ranges it names; ONNX and JSON (a config.json, or `posenc audit --remote`'s extract) whole, and parsed where the
source runs its readers' work (`Source.compute`: a worker thread for an upload). `detect` tells the format from the
first bytes; `READERS` holds the reader of each.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from posenc.models.audit.found import Found
from posenc.service.audit import config_reader, gguf_reader, onnx_reader, safetensors_reader
from posenc.service.audit.stream import Source

Reader = Callable[[Source], Awaitable[Found]]
PREFIX = 16  # bytes `detect` looks at


async def read_gguf(source: Source) -> Found:
    header, tensors = await source.header(gguf_reader.parse_header, "gguf")
    return gguf_reader.to_found(header, tensors)


async def read_safetensors(source: Source) -> Found:
    header, tensors = await source.header(safetensors_reader.parse_header, "safetensors")
    return safetensors_reader.to_found(header, tensors)


def _onnx_found(body: bytes, folder: Path | None) -> Found:
    """The model counted, loaded without its external data and scanned (a local file's external data is read beside
    it, for the few constants that matter)."""
    return onnx_reader.to_found(onnx_reader.load(data=body), folder)


async def read_onnx(source: Source) -> Found:
    body = await source.whole("onnx")
    return await source.compute(_onnx_found, body, source.folder)


async def read_json(source: Source) -> Found:
    body = await source.whole("json")
    return await source.compute(config_reader.document_found, body)


READERS: dict[str, Reader] = {"gguf": read_gguf, "safetensors": read_safetensors, "json": read_json,
                              "onnx": read_onnx}


def detect(prefix: bytes) -> str:
    """The format (a key of READERS) from a file's first bytes: GGUF magic, a safetensors header length then '{',
    JSON (an object or an array, which no ONNX model starts with: their first bytes would be protobuf start-group
    tags), else an ONNX protobuf. A '{' at byte 8 alone does not make safetensors: a minified config.json may have
    one there (`{"meta":{`). Eight bytes of JSON text hold no NUL, while a safetensors header length (little-endian)
    under 2**56 bytes ends in one: text that starts as JSON and holds no NUL is JSON."""
    if prefix[:4] == b"GGUF":
        return "gguf"
    starts_as_json = prefix.lstrip()[:1] in (b"{", b"[")
    if len(prefix) >= 9 and prefix[8:9] == b"{" and not (starts_as_json and b"\x00" not in prefix[:8]):
        return "safetensors"
    if starts_as_json:
        return "json"
    return "onnx"


async def read(source: Source) -> Found:
    """The facts of the file `source` holds, read by the reader of its format."""
    return await READERS[detect(await source.start(PREFIX))](source)
