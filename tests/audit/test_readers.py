"""The readers' one interface: `posenc audit FILE` and POST /v1/audit read every format through one dispatch
(`readers.read`: the same bytes give the same report or the same refusal); the safetensors reader refuses every
header the upload decoder refuses, with its message; a JSON document that is not an object gets the one message."""

from __future__ import annotations

import asyncio
import io
import json
import re
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from posenc.models.audit.found import Found
from posenc.models.rope import inv_freq_and_attention_factor
from posenc.models.rope_config import rope_parameters_from_config
from posenc.service.audit import extract, readers, safetensors_reader
from posenc.service.audit.run import parse_config, read_path, read_upload
from posenc.service.audit.stream import read_file
from posenc.service.cli.main import main
from posenc.service.codec.decode import decode_safetensors_bundle
from posenc.service.codec.safetensors_header import CODEC_BITS, FORMAT_BITS
from posenc.service.errors import BadRequest, ServiceError
from posenc.service.settings import Settings
from tests.audit_files import SMALL_LLAMA3, caches_of, genai_onnx, llama3_rope_factors, llama_gguf_meta, write_gguf

INV_FREQ = "model.layers.0.self_attn.rotary_emb.inv_freq"


def _inv_freq() -> np.ndarray:
    params, _ = rope_parameters_from_config(SMALL_LLAMA3)
    return inv_freq_and_attention_factor(params)[0].astype(np.float32)


def _safetensors(header: bytes | dict[str, Any], data: int | bytes = 16) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + (bytes(data) if isinstance(data, int) else data)


def _chunked(body: bytes, size: int = 256) -> Iterator[bytes]:
    """A generator body: httpx sends it chunked, with no Content-Length."""
    for start in range(0, len(body), size):
        yield body[start:start + size]


def _command(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> tuple[int, Any]:
    """`posenc audit PATH --json ARGS`: (exit status, the report, or the message of a refusal)."""
    status = main(["audit", str(path), "--json", *args])
    out, err = capsys.readouterr()
    if status == 2:
        return status, err.strip().removeprefix("posenc audit: ")
    return status, json.loads(out)


def _route(client: TestClient, body: Any, **params: str) -> tuple[int, Any]:
    """POST /v1/audit: (status, the report, or the message of a refusal)."""
    answer = client.post("/v1/audit", content=body, params=params)
    return answer.status_code, answer.json() if answer.status_code == 200 else answer.json()["error"]


def _unnamed(message: str) -> str:
    """A refusal without the name of its source ("GGUF file: ", "gguf upload: "): what a file and an upload share."""
    return re.sub(r"^(GGUF|gguf|safetensors|onnx|json) (file|upload): ", "", message)


# --- one dispatch: the same bytes, the same answer --------------------------------------------------------------

def _files(folder: Path) -> dict[str, Path]:
    freqs = {"rope_freqs.weight": llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)}
    gguf = write_gguf(folder / "model.gguf", "llama", llama_gguf_meta(131072, 500000.0), freqs)
    checkpoint = folder / "model.safetensors"
    save_file({"model.embed_tokens.weight": np.zeros((16, 8), np.float32), INV_FREQ: _inv_freq()}, str(checkpoint))
    onnx = folder / "model.onnx"
    onnx.write_bytes(genai_onnx(*caches_of(SMALL_LLAMA3, 1024)))
    config = folder / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA3))
    extracted = folder / "extract.json"
    extracted.write_text(json.dumps(extract.dump(read_path(onnx, Settings()))))
    hostile = {
        "cut.gguf": gguf.read_bytes()[:100],
        "lying.safetensors": _safetensors({INV_FREQ: {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}}),
        "overlap.safetensors": _safetensors({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                             "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}),
        "array.json": b"[1, 2]",
        "broken.json": b'{"model_type": ',
        "extract.json": json.dumps({extract.MARK: 1, "source": "nowhere"}).encode(),
        "garbage.onnx": b"\x08\x07" + bytes(range(256)),
    }
    out = {path.name: path for path in (gguf, checkpoint, onnx, config, extracted)}
    for name, data in hostile.items():
        (folder / f"bad-{name}").write_bytes(data)
        out[f"bad-{name}"] = folder / f"bad-{name}"
    return out


def test_the_command_and_the_route_answer_the_same_bytes_alike(client: TestClient, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Every format, good and hostile: the report of `posenc audit FILE --json` is the route's, a refusal says the
    same but for the name of its source."""
    params = {"config": json.dumps(SMALL_LLAMA3)}
    for name, path in _files(tmp_path).items():
        status, answer = _command(capsys, path, "--config", str(tmp_path / "config.json"))
        code, routed = _route(client, path.read_bytes(), **params)
        if name == "bad-cut.gguf":  # a file ends, a body ends: each says where
            assert (status, code) == (2, 400) and "truncated" in answer and "truncated" in routed, (answer, routed)
        elif name.startswith("bad-"):
            assert (status, code) == (2, 400), (name, answer, routed)
            assert _unnamed(answer) == _unnamed(routed), name
        else:
            assert code == 200 and status in (0, 1), (name, routed)
            assert answer == routed, name


def test_a_format_added_to_the_one_table_reaches_the_command_and_the_route(
        client: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader registered in `readers.READERS` (and told by `readers.detect`) is what both read a file with."""
    async def fake(source: Any) -> Found:
        body = await source.whole("fake")
        if b"refuse" in body:
            raise BadRequest("fake: refused by the one reader")
        found = Found("config.json", architecture="fake-architecture")
        found.notes.append(f"read by the fake reader: {len(body)} bytes")
        return found

    told = readers.detect
    monkeypatch.setitem(readers.READERS, "fake", fake)
    monkeypatch.setattr(readers, "detect", lambda prefix: "fake" if prefix.startswith(b"FAKE") else told(prefix))
    for body in (b"FAKE format, 30 bytes of it...", b"FAKE, refuse it"):
        path = tmp_path / "model.fake"
        path.write_bytes(body)
        status, answer = _command(capsys, path)
        code, routed = _route(client, body)
        if b"refuse" in body:
            assert (status, code, answer, routed) == (2, 400, "fake: refused by the one reader",
                                                      "fake: refused by the one reader")
        else:
            assert code == 200 and answer == routed, routed
            assert answer["notes"] == [f"read by the fake reader: {len(body)} bytes"]


def test_the_route_and_the_command_read_through_readers_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             client: TestClient) -> None:
    seen: list[str] = []
    real = readers.read

    async def counted(source: Any) -> Found:
        seen.append(type(source).__name__)
        return await real(source)

    monkeypatch.setattr(readers, "read", counted)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_LLAMA3))
    read_path(path, Settings())
    assert client.post("/v1/audit", content=path.read_bytes()).status_code == 200
    assert seen == ["FileSource", "UploadSource"]


# --- the format told from the first bytes ------------------------------------------------------------------------

MINIFIED = json.dumps(SMALL_LLAMA3, separators=(",", ":"))
# minified config.json documents with a '{' at byte 8, where a safetensors file's header starts
BRACE_AT_BYTE_8 = {"an object value": '{"meta":{"by":"hand"},' + MINIFIED[1:], "a key": '{"a":1,"{":0,' + MINIFIED[1:]}


@pytest.mark.parametrize("case", BRACE_AT_BYTE_8)
def test_a_minified_config_with_a_brace_at_byte_8_is_read_as_a_config(
        client: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str) -> None:
    """Before: told as safetensors, its first 8 bytes of text read as a header length of about 4e18, a 400. Read as
    JSON, it reports what the same config without the extra entry reports."""
    text = BRACE_AT_BYTE_8[case]
    assert text[8] == "{" and json.loads(text)["rope_theta"] == SMALL_LLAMA3["rope_theta"]
    plain, crafted = tmp_path / "plain.json", tmp_path / "config.json"
    plain.write_text(MINIFIED)
    crafted.write_text(text)
    status, answer = _command(capsys, crafted)
    assert status in (0, 1), answer
    assert answer["source"] == "config.json" and answer == _command(capsys, plain)[1]
    code, routed = _route(client, text.encode())
    assert code == 200 and routed == answer, routed


@pytest.mark.parametrize("length", [0x7B, 0x207B, 0x7B20], ids=["{", "{ ", " {"])
def test_a_safetensors_header_length_whose_bytes_read_as_a_brace_is_still_safetensors(
        client: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str], length: int) -> None:
    """The length's first bytes may be '{' or whitespace then '{' (its last byte is 0): still a safetensors file."""
    inv_freq = _inv_freq()
    entry = {"dtype": "F32", "shape": [inv_freq.size], "data_offsets": [0, inv_freq.nbytes]}
    header = json.dumps({INV_FREQ: entry}).encode().ljust(length)  # trailing spaces: allowed padding
    body = _safetensors(header, inv_freq.tobytes())
    assert body[8:9] == b"{" and body.lstrip()[:1] == b"{"
    path = tmp_path / "model.safetensors"
    path.write_bytes(body)
    status, answer = _command(capsys, path)
    assert status in (0, 1), answer
    assert answer["source"] == "safetensors" and answer["found"]["rotary_dim"] == 2 * inv_freq.size
    assert _route(client, body) == (200, answer)


# --- the safetensors header: the codec's checks, the codec's refusals ----------------------------------------

F32x4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
HOSTILE = {
    "offsets past the end": (_safetensors({"model.embed_tokens.weight": F32x4}, 12), "<= 12 (the data size)"),
    "overlapping tensors": (_safetensors({"a": F32x4, "b": {**F32x4, "shape": [2], "data_offsets": [8, 16]}}),
                            "overlaps the previous tensor"),
    "overlapping the position tensor": (_safetensors({INV_FREQ: F32x4, "b": F32x4}), "overlaps the previous tensor"),
    "a hole": (_safetensors({"a": {**F32x4, "shape": [2], "data_offsets": [8, 16]}}), "leaves a hole"),
    "shape and dtype another size": (_safetensors({"a": {**F32x4, "shape": [5]}}), "needs 20"),
    "dtype another size": (_safetensors({"a": {**F32x4, "dtype": "F64"}}), "needs 32"),
    "unknown dtype": (_safetensors({"a": {**F32x4, "dtype": "Q7"}}), "has dtype 'Q7'; accepted: "),
    "data past the tensors": (_safetensors({"a": F32x4}, 20), "cover 16 bytes but the data section has 20"),
    "duplicate keys": (_safetensors(b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                                    b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', 8), "duplicate"),
    "an extra key": (_safetensors({"a": {**F32x4, "note": "x"}}), "needs exactly dtype, shape and data_offsets"),
    "float offsets": (_safetensors({"a": {**F32x4, "data_offsets": [0, 16.0]}}), "data_offsets [0, 16.0]"),
    "metadata not strings": (_safetensors({"__metadata__": {"a": 1}, "a": F32x4}), "__metadata__ must map"),
    "not UTF-8": (_safetensors(b'{"\xff": ' + json.dumps(F32x4).encode() + b"}"), "not valid UTF-8 JSON"),
}


def _codec_refusal(body: bytes) -> str | None:
    try:
        decode_safetensors_bundle(body)
    except BadRequest as exc:
        return exc.message
    return None


def _audit_refusal(body: bytes) -> str | None:
    """The audit's safetensors reader over `body` as a file of that size (`stream.read_file`)."""
    try:
        read_file(io.BytesIO(body), len(body), safetensors_reader.parse_header, 1 << 20, "safetensors file")
    except ServiceError as exc:
        return exc.message
    return None


def _same_refusal(codec: str, audit: str) -> bool:
    """The codec's message, named for the audit's source (and the audit's dtype codes are the format's)."""
    cut = "; accepted: "
    return audit.removeprefix("safetensors file") == codec.removeprefix("safetensors") or (
        cut in codec and audit.removeprefix("safetensors file").split(cut)[0] == codec.removeprefix(
            "safetensors").split(cut)[0])


@pytest.mark.parametrize("case", HOSTILE)
def test_the_reader_refuses_what_the_codec_refuses(client: TestClient, tmp_path: Path, case: str) -> None:
    """A header the upload decoder refuses, the audit refuses with the same message: from a file, an upload with a
    Content-Length, and a chunked one (read to its end where the refusal is about the data's size)."""
    body, words = HOSTILE[case]
    codec = _codec_refusal(body)
    assert codec is not None and words in codec, codec
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(body)
    with pytest.raises(BadRequest) as by_file:
        read_path(path, Settings())
    assert _same_refusal(codec, by_file.value.message), (codec, by_file.value.message)
    code, routed = _route(client, body)
    assert code == 400 and _same_refusal(codec, routed.replace("safetensors upload", "safetensors file")), routed
    code, chunked = _route(client, _chunked(body, 7))
    assert code == 400, chunked
    if case == "offsets past the end":  # without a Content-Length, that is found at the body's end
        assert "the tensors cover 16 bytes but the data section has 12" in chunked, chunked
    else:  # where offsets are bounded, by 2**63 until the size is known
        bound = re.compile(r" with 0 <= begin <= end .*$")
        assert _same_refusal(bound.sub("", codec), bound.sub("", chunked.replace("safetensors upload",
                                                                                 "safetensors file"))), chunked


ENTRY = st.fixed_dictionaries({
    "dtype": st.sampled_from(["F32", "F16", "BF16", "U8", "I64", "Q7"]),
    "shape": st.lists(st.sampled_from([-1, 0, 1, 2, 4]), max_size=2),
    "data_offsets": st.lists(st.sampled_from([-1, 0, 2, 4, 8, 12, 16, 2.0]), min_size=1, max_size=3),
})
HEADERS = st.dictionaries(st.sampled_from(["a", "b", INV_FREQ, "transformer.wpe.weight"]), ENTRY, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=HEADERS, data=st.sampled_from([0, 4, 8, 12, 16, 32]))
def test_no_header_the_codec_refuses_passes_the_reader(header: dict[str, Any], data: int) -> None:
    """Whatever the codec refuses the reader refuses; where every shape is within the audit's own bound (checked
    first, by `values.shape`), with the codec's message."""
    body = _safetensors(header, data)
    codec, audit = _codec_refusal(body), _audit_refusal(body)
    if codec is None:
        return
    assert audit is not None, (header, data, codec)
    if all(all(n >= 0 for n in entry["shape"]) for entry in header.values()):
        assert _same_refusal(codec, audit), (codec, audit)


def test_the_readers_dtype_codes_are_the_codecs_and_the_formats(tmp_path: Path) -> None:
    """The audit takes every code of the format (an FP8 checkpoint is a real file), the codec's among them with the
    same sizes; a code of neither is refused by both."""
    assert {code: FORMAT_BITS[code] for code in CODEC_BITS} == CODEC_BITS
    fp8 = _safetensors({"model.layers.0.mlp.weight": {"dtype": "F8_E4M3", "shape": [4, 4], "data_offsets": [0, 16]},
                        INV_FREQ: {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}, 32)
    assert "F8_E4M3" in (_codec_refusal(fp8) or "")
    assert _audit_refusal(fp8) is None
    half = _safetensors({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2)  # 12 bits
    assert "not a whole number of bytes" in (_audit_refusal(half) or "")


def test_a_chunked_checkpoint_is_read_to_its_end(client: TestClient, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({INV_FREQ: _inv_freq(), "model.embed_tokens.weight": np.zeros((64, 8), np.float32)}, str(path))
    body = path.read_bytes()
    sized, chunked = client.post("/v1/audit", content=body), client.post("/v1/audit", content=_chunked(body))
    assert sized.status_code == chunked.status_code == 200 and sized.json() == chunked.json()

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in _chunked(body + bytes(4)):
            yield chunk

    data = len(body) - 8 - struct.unpack_from("<Q", body)[0]
    with pytest.raises(BadRequest, match=f"the tensors cover {data} bytes but the data section has {data + 4}"):
        asyncio.run(read_upload(chunks(), None, Settings()))


# --- a JSON document that is not an object: one message ----------------------------------------------------------

@pytest.mark.parametrize("document", [b"[1, 2]", b"3", b'"config"'])
def test_a_json_value_that_is_no_object_gets_the_one_message(
        client: TestClient, tmp_path: Path, capsys: pytest.CaptureFixture[str], document: bytes) -> None:
    """As the reference config (`--config`, `?config=`), as a safetensors header (the codec's and the audit's
    reader), and as the file audited where the bytes are told as JSON (an array)."""
    with pytest.raises(BadRequest) as parsed:
        parse_config(document)
    assert parsed.value.message == "config must be a JSON object"
    reference = tmp_path / "config.json"
    reference.write_bytes(document)
    model = write_gguf(tmp_path / "model.gguf", "llama", llama_gguf_meta(8192, 500000.0))
    assert _command(capsys, model, "--config", str(reference)) == (2, "config must be a JSON object")
    assert _route(client, model.read_bytes(), config=document.decode()) == (400, "config must be a JSON object")
    header = _safetensors(document, 0)
    assert _codec_refusal(header) == "safetensors: header must be a JSON object"
    assert _audit_refusal(header) == "safetensors file: header must be a JSON object"
    if document.startswith(b"["):
        assert _command(capsys, reference) == (2, "JSON upload must be a JSON object")
        assert _route(client, document) == (400, "JSON upload must be a JSON object")
