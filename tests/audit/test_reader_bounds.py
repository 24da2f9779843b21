"""The JSON and GGUF readers of the audit: entries, nesting and strings counted against their bounds before
anything is built, each header parsed once (a streamed one at most twice, the first time over its first 64 KiB),
off the event loop, in CPU time linear in its size (issue 55, items 7 and 8)."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from posenc.service.audit import gguf_reader
from posenc.service.audit.run import parse_config, read_path, read_upload
from posenc.service.audit.stream import Cursor, Layout
from posenc.service.errors import BadRequest, PayloadTooLarge
from posenc.service.settings import Settings
from tests.audit.conftest import readyz_while_held
from tests.conftest import running_client
from tests.growth import assert_linear

pytest.importorskip("gguf", reason="the audit extra (gguf, onnx): pip install 'posenc[audit]'")


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


ARCHITECTURE = _string(b"general.architecture") + struct.pack("<I", 8) + _string(b"llama")


def _gguf_tensors(n: int) -> bytes:
    """A GGUF header of `n` tensor infos (one F32 value each, all at offset 0), 33 bytes an info."""
    info = _string(b"t") + struct.pack("<IQIQ", 1, 1, 0, 0)
    return b"GGUF" + struct.pack("<IQQ", 3, n, 1) + ARCHITECTURE + info * n + bytes(64)


def _gguf_strings(n: int) -> bytes:
    """A GGUF header whose vocabulary is `n` empty strings (8 bytes each)."""
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + ARCHITECTURE + _string(b"tokenizer.ggml.tokens")
            + struct.pack("<IIQ", 9, 8, n) + bytes(8 * n))


def _gguf_keys(n: int, strings: int = 64) -> bytes:
    """A GGUF header of `n` metadata keys, each an array of `strings` empty strings (kept: at most KEPT_ARRAY)."""
    array = struct.pack("<IIQ", 9, 8, strings) + _string(b"") * strings
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n + 1) + ARCHITECTURE + b"".join(
        _string(b"k%07d" % i) + array for i in range(n))


def _empty_objects(mib: float) -> bytes:
    """`{"a":[{},{},...]}` of about `mib` MiB."""
    count = int(mib * (1 << 20)) // 3
    return b'{"a":[' + b"{}," * (count - 1) + b"{}]}"


def _safetensors(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 1 << 16):
        yield data[start:start + (1 << 16)]


def _upload(data: bytes) -> Any:
    return asyncio.run(read_upload(_chunks(data), len(data), Settings()))


def _cpu(call: Callable[[], Any]) -> tuple[float, Any]:
    """CPU seconds of `call` in this process (worker threads included; the best of two: the machine may be
    shared), and what it returned or raised."""
    best, outcome = float("inf"), None
    for _ in range(2):
        start = time.process_time()
        try:
            outcome = call()
        except (BadRequest, PayloadTooLarge) as exc:
            outcome = exc
        best = min(best, time.process_time() - start)
    return best, outcome


def _never_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("the JSON was parsed: the count should have refused it first")

    monkeypatch.setattr(json, "loads", refuse)


# JSON

@pytest.mark.parametrize(("data", "words"), [
    (_empty_objects(3), "more than 100000 JSON values"),  # 1M empty dicts
    (b'{"a":[' + b'"",' * (1 << 20) + b'""]}', "more than 100000 JSON values"),  # 1M strings: quotes counted
    (b'{"a":' + b"[" * 64 + b"]" * 64 + b"}", "nested 65 levels deep; at most 64"),
])
def test_a_config_upload_is_counted_before_it_is_parsed(monkeypatch: pytest.MonkeyPatch, data: bytes,
                                                        words: str) -> None:
    """60 MiB of `{"a":[{},{},...]}` took 1.8 GB and 3.1 s of CPU, parsed (the first two here were a 200)."""
    _never_parsed(monkeypatch)
    cpu, outcome = _cpu(lambda: _upload(data))
    assert isinstance(outcome, BadRequest | PayloadTooLarge) and words in outcome.message, outcome
    assert cpu < 0.5, cpu


def test_the_config_parameter_is_counted_too() -> None:
    with pytest.raises(PayloadTooLarge, match="config: more than 100000 JSON values"):
        parse_config((b'{"a":[' + b"0," * 100_000 + b"0]}").decode())
    with pytest.raises(BadRequest, match="config: JSON nested 65 levels deep"):
        parse_config("[" * 65 + "]" * 65)


def test_real_documents_are_read_whatever_their_strings_hold() -> None:
    """Brackets, commas and escaped quotes inside strings are no structure; UTF-16 is JSON too."""
    template = "{% for m in messages %}{{ m['content'] + \"[,{\" }}{% endfor %}, \\\" " * 4000
    config = {"model_type": "llama", "chat_template": template, "id2label": {str(i): f"l{i}" for i in range(40_000)}}
    assert parse_config(json.dumps(config)) == config
    assert parse_config(json.dumps({"a": [1, 2]}).encode("utf-16")) == {"a": [1, 2]}


def test_a_safetensors_header_of_empty_objects_is_refused_before_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 48 MiB header of `{}`s took 1.48 GB parsed (then a 400 for its first entry); a few MiB now a 413 that
    names the bound, never parsed."""
    _never_parsed(monkeypatch)
    cpu, outcome = _cpu(lambda: _upload(_safetensors(_empty_objects(8))))
    assert isinstance(outcome, PayloadTooLarge), outcome
    assert "the safetensors header: more than 1835008 JSON values" in outcome.message
    assert cpu < 1.0, cpu


def test_a_safetensors_header_of_too_many_tensors_is_refused() -> None:
    entry = b'"t%d":{"dtype":"F32","shape":[],"data_offsets":[0,0]}'
    header = b"{" + b",".join(entry % i for i in range((1 << 17) + 1)) + b"}"
    with pytest.raises(PayloadTooLarge, match="more than 131072 tensors"):
        _upload(_safetensors(header))


def _refused_upload(data: bytes) -> BadRequest | PayloadTooLarge:
    with pytest.raises((BadRequest, PayloadTooLarge)) as refused:
        _upload(data)
    return refused.value


def test_the_json_count_is_linear() -> None:
    """Refusing 8x the bytes costs about 8x, not 64x."""
    assert isinstance(_refused_upload(_empty_objects(8)), PayloadTooLarge)
    assert_linear(_refused_upload, _empty_objects(1), _empty_objects(8))


def test_a_real_safetensors_header_is_read_in_linear_time() -> None:
    entry = b'"model.layers.%d.mlp.experts.%d.down_proj.weight":{"dtype":"BF16","shape":[1,2],' \
            b'"data_offsets":[%d,%d]}'

    def header(n: int) -> bytes:
        """`n` tensors tiling `4 n` bytes of data, as the format requires (the header is checked as the codec
        checks it)."""
        entries = b",".join(entry % (i // 256, i % 256, 4 * i, 4 * i + 4) for i in range(n))
        return _safetensors(b"{" + entries + b"}") + bytes(4 * n)

    assert _upload(header(5_000)).source == "safetensors"
    _, large = assert_linear(_upload, header(5_000), header(40_000))
    assert large < 4.0, large


# GGUF

@pytest.mark.parametrize(("data", "words"), [
    (_gguf_tensors(100_000), "100000 tensors; at most 4096 and 65536"),  # 3.3 MB
    (_gguf_strings((1 << 21) + 1), "more than 2097152 strings in metadata arrays"),  # 16 MiB
    (_gguf_keys(8192), "8193 metadata entries"),  # 4.5 MB
])
def test_gguf_counts_are_refused_before_they_are_walked(data: bytes, words: str) -> None:
    """1M tensor infos took 14.1 s of CPU, 4M empty strings 4.5 s, 65k keys of 64-string arrays 9.9 s, all
    accepted and parsed on the event loop; past the bounds now a 400 at once."""
    cpu, outcome = _cpu(lambda: _upload(data))
    assert isinstance(outcome, BadRequest) and words in outcome.message, outcome
    assert cpu < 0.5, cpu


def test_kept_strings_count_against_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arrays of up to KEPT_ARRAY strings are kept as Python strings: they count as the walked ones do."""
    monkeypatch.setattr(gguf_reader, "MAX_STRINGS", 100)
    with pytest.raises(BadRequest, match="more than 100 strings in metadata arrays"):
        _upload(_gguf_keys(2))


@pytest.mark.parametrize(("make", "small"), [(_gguf_tensors, 8_000), (_gguf_strings, 250_000), (_gguf_keys, 500)])
def test_gguf_headers_within_the_bounds_are_read_in_linear_time(make: Callable[[int], bytes], small: int) -> None:
    assert _upload(make(small)).source == "gguf"
    _, large = assert_linear(_upload, make(small), make(8 * small))
    assert large < 2.0, large


def _counting_parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes at hand at each parse of a GGUF header."""
    seen: list[int] = []
    real = gguf_reader.parse_header

    def counted(c: Cursor) -> Layout:
        seen.append(len(c.data))
        return real(c)

    monkeypatch.setattr(gguf_reader, "parse_header", counted)
    return seen


def test_a_streamed_gguf_header_is_parsed_at_most_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The header was parsed again from its start after each doubling of the bytes read (6 times for 2 MiB)."""
    seen = _counting_parses(monkeypatch)
    data = _gguf_tensors(65_535)
    assert _upload(data).source == "gguf"
    assert seen == [1 << 16, len(data)], seen


def test_a_gguf_file_header_is_parsed_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen = _counting_parses(monkeypatch)
    path = tmp_path / "tensors.gguf"
    path.write_bytes(_gguf_tensors(65_535))
    assert read_path(path, Settings()).source == "gguf"
    assert len(seen) == 1, seen


def test_readyz_answers_while_a_gguf_header_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GGUF header is parsed in a worker thread: the event loop answers /readyz meanwhile (it was parsed on
    the loop: /readyz took over a second 18 times during one audit)."""
    readyz_while_held(monkeypatch, gguf_reader, "parse_header", _gguf_tensors(65_535))


@pytest.mark.parametrize(("data", "status", "words"), [
    (_empty_objects(3), 413, "more than 100000 JSON values"),
    (_safetensors(_empty_objects(8)), 413, "more than 1835008 JSON values"),
    (_gguf_tensors(100_000), 400, "at most 4096 and 65536"),
])
def test_the_route_names_the_bound(data: bytes, status: int, words: str) -> None:
    with running_client() as client:
        response = client.post("/v1/audit", content=data)
        config = client.post("/v1/audit", content=_gguf_tensors(10), params={"config": "[" * 65 + "]" * 65})
    assert response.status_code == status and words in response.text, response.text
    assert config.status_code == 400 and "nested 65 levels deep" in config.text, config.text
