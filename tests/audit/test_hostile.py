"""Truncated and hostile files get a clear 400 within a time and memory bound: lying offsets, tensor sizes past
the end, 2^32 metadata entries, huge strings and arrays, recursion in ONNX functions, bytes that are no model."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from posenc.service.audit.run import read_path
from posenc.service.errors import BadRequest, PayloadTooLarge
from posenc.service.settings import Settings
from tests.audit.conftest import bytes_read
from tests.audit_files import llama3_rope_factors, llama_gguf_meta, write_gguf


def _gguf_head(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _tensor_info(name: bytes, shape: list[int], kind: int = 0, offset: int = 0) -> bytes:
    """A GGUF tensor info: name, dimensions, type (0: F32) and data offset."""
    return _string(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *shape) + struct.pack(
        "<IQ", kind, offset)


ARCHITECTURE = _string(b"general.architecture") + struct.pack("<I", 8) + _string(b"llama")  # a STRING entry


def _safetensors(tensor: bytes, data: int = 16) -> bytes:
    """A safetensors file of one tensor, `model.rotary_emb.inv_freq` (`tensor`: its header entry), and `data` bytes."""
    header = b'{"model.rotary_emb.inv_freq": ' + tensor + b"}"
    return struct.pack("<Q", len(header)) + header + bytes(data)


def _refused(path: Path, *words: str) -> str:
    tracemalloc.start()
    before = bytes_read()
    with pytest.raises((BadRequest, PayloadTooLarge)) as caught:
        read_path(path, Settings())
    read, peak = bytes_read() - before, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # refused from what it declares, before reading or holding what it claims to carry
    assert read < 80 << 20 and peak < 80 << 20, (read, peak)
    message = caught.value.message
    assert all(word in message for word in words), message
    return message


def test_2_to_the_32_metadata_entries(tmp_path: Path) -> None:
    path = tmp_path / "kv.gguf"
    path.write_bytes(_gguf_head(0, 1 << 32))
    _refused(path, "4294967296 metadata entries")


def test_an_array_of_2_to_the_32_strings(tmp_path: Path) -> None:
    path = tmp_path / "array.gguf"
    path.write_bytes(_gguf_head(0, 1) + _string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 1 << 32))
    _refused(path, "4294967296 entries")


def test_a_string_longer_than_the_file(tmp_path: Path) -> None:
    path = tmp_path / "string.gguf"
    path.write_bytes(_gguf_head(0, 1) + struct.pack("<Q", 1 << 62))
    _refused(path, "metadata key")


def test_truncated_header(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "good.gguf", "llama", llama_gguf_meta(4096, 500000.0))
    path = tmp_path / "cut.gguf"
    path.write_bytes(good.read_bytes()[:100])
    _refused(path, "truncated")


def test_tensor_data_past_the_end(tmp_path: Path) -> None:
    good = write_gguf(tmp_path / "good.gguf", "llama", llama_gguf_meta(131072, 500000.0),
                      {"rope_freqs.weight": llama3_rope_factors(500000.0, 128, 8, 1, 4, 8192)}, sparse_bytes=1 << 20)
    path = tmp_path / "cut.gguf"
    path.write_bytes(good.read_bytes()[: good.stat().st_size - 4096])
    _refused(path, "past the end")


def test_lying_tensor_offset(tmp_path: Path) -> None:
    path = tmp_path / "offset.gguf"
    path.write_bytes(_gguf_head(1, 1) + ARCHITECTURE + _tensor_info(b"rope_freqs.weight", [64], offset=1 << 50)
                     + bytes(64))
    _refused(path, "past the end")


def test_safetensors_lying_offsets(tmp_path: Path) -> None:
    path = tmp_path / "lie.safetensors"
    path.write_bytes(_safetensors(b'{"dtype": "F32", "shape": [4], "data_offsets": [0, 1099511627776]}'))
    _refused(path)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 60) + b"{")
    _refused(huge, "the safetensors header declares 1152921504606846976 bytes")


@pytest.mark.parametrize(("name", "data", "words"), [
    ("version.gguf", b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "GGUF version 1 is not supported"),
    ("dims.gguf", _gguf_head(1, 0) + _string(b"t") + struct.pack("<I", 9), "declares 9 dimensions"),
    ("alignment.gguf", _gguf_head(0, 1) + _string(b"general.alignment") + struct.pack("<II", 4, 0),
     "general.alignment 0 is not a usable alignment"),
    ("factors.gguf", _gguf_head(1, 1) + ARCHITECTURE + _tensor_info(b"rope_freqs.weight", [70000]),
     "rope_freqs.weight must be F32 with at most 65536 values"),
    ("quantized.gguf", _gguf_head(1, 1) + ARCHITECTURE + _tensor_info(b"rope_freqs.weight", [64], kind=1),
     "rope_freqs.weight must be F32"),
    ("negative.safetensors", _safetensors(b'{"dtype": "F32", "shape": [-4], "data_offsets": [0, 0]}'),
     "invalid offsets or shape"),
    ("reversed.safetensors", _safetensors(b'{"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}'),
     "data_offsets [16, 0] must be [begin, end] with 0 <= begin <= end <= 16"),
    ("span.safetensors", _safetensors(b'{"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}'),
     "spans 8 bytes but shape [4] of F32 needs 16"),
])
def test_each_declared_bound_is_refused_by_name(tmp_path: Path, name: str, data: bytes, words: str) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    _refused(path, words)


def test_strings_in_metadata_arrays_are_bounded_per_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Vocabularies are walked, not kept, up to a bound on the strings of one header (each array alone fits)."""
    monkeypatch.setattr("posenc.service.audit.gguf_reader.MAX_STRINGS", 100)
    vocabulary = struct.pack("<IQ", 8, 65) + _string(b"x") * 65  # 65 strings: past KEPT_ARRAY, walked
    path = tmp_path / "vocabularies.gguf"
    path.write_bytes(_gguf_head(0, 2) + _string(b"tokenizer.a") + struct.pack("<I", 9) + vocabulary
                     + _string(b"tokenizer.b") + struct.pack("<I", 9) + vocabulary)
    _refused(path, "more than 100 strings in metadata arrays")


def test_a_header_past_the_configured_bound_is_a_413(tmp_path: Path) -> None:
    """Every field fits where it starts, but the fields together run past POSENC_AUDIT_MAX_HEADER_BYTES."""
    entries = b"".join(_string(b"k%d" % i) + struct.pack("<II", 4, i) for i in range(200))  # UINT32 values
    path = tmp_path / "long.gguf"
    path.write_bytes(_gguf_head(0, 200) + entries)
    with pytest.raises(PayloadTooLarge, match=r"^GGUF file: the header is larger than .*POSENC_AUDIT_MAX_HEADER_BYTES"):
        read_path(path, Settings(audit_max_header_bytes=2048))


def test_onnx_recursive_function(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    call = helper.make_node("Loop2", ["x"], ["y"], domain="local")
    function = helper.make_function("local", "Loop2", ["x"], ["y"], [call], [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Loop2", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 17),
                                                                          helper.make_opsetid("local", 1)])
    path = tmp_path / "recursive.onnx"
    path.write_bytes(model.SerializeToString())
    _refused(path, "nest deeper")


def test_bytes_that_are_no_model(tmp_path: Path) -> None:
    path = tmp_path / "noise.onnx"
    path.write_bytes(b"\xff\xfe not a protobuf \x00" * 100)
    _refused(path, "not a readable ONNX model")


def _mutations(data: bytes, rng: np.random.Generator, count: int) -> list[bytes]:
    """Truncations, flipped bytes and overwritten length fields of a valid file."""
    out = []
    for _ in range(count):
        body = bytearray(data)
        kind = rng.integers(3)
        if kind == 0:
            body = body[: int(rng.integers(0, len(body)))]
        elif kind == 1:
            for _ in range(int(rng.integers(1, 8))):
                body[int(rng.integers(0, len(body)))] = int(rng.integers(0, 256))
        else:
            at = int(rng.integers(0, max(len(body) - 8, 1)))
            values = (0, 1, 2**31, 2**32, 2**63 - 1, 2**64 - 1)
            body[at:at + 8] = struct.pack("<Q", values[int(rng.integers(len(values)))])
        out.append(bytes(body))
    return out


def test_mangled_files_are_refused_or_audited_never_a_500(tmp_path: Path) -> None:
    from tests.audit_files import SMALL_LLAMA3, caches_of, genai_onnx, inv_freq_onnx
    from tests.conftest import running_client

    gguf = write_gguf(tmp_path / "good.gguf", "llama", llama_gguf_meta(8192, 500000.0),
                      {"rope_freqs.weight": llama3_rope_factors(500000.0, 128, 8, 1, 4, 8192)}).read_bytes()
    safetensors = _safetensors(b'{"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}')
    cos, sin = caches_of(SMALL_LLAMA3, 64)
    extract = (b'{"posenc_audit_extract": 1, "source": "onnx", "context_length": 64, "rotary_dim": 64, '
               b'"scaling": {}, "inv_freq": {"dtype": "float32", "shape": [2], "data": "AACAPwAAAD8="}}')
    rng = np.random.default_rng(0)
    bodies = [*_mutations(gguf, rng, 60), *_mutations(safetensors, rng, 30), *_mutations(genai_onnx(cos, sin), rng, 30),
              *_mutations(inv_freq_onnx(np.ones(32, np.float32)), rng, 20), *_mutations(extract, rng, 40)]
    statuses = set()
    with running_client() as client:
        for body in bodies:
            response = client.post("/v1/audit", content=body)
            assert response.status_code < 500, (response.status_code, response.text, body[:64])
            statuses.add(response.status_code)
    assert 400 in statuses and 200 in statuses


def _extract_cases() -> list[dict[str, object]]:
    import base64

    from posenc.service.audit.extract import SCALARS

    def array(shape: list[int]) -> dict[str, object]:
        return {"dtype": "float32", "shape": shape,
                "data": base64.b64encode(np.ones(int(np.prod(shape)), np.float32).tobytes()).decode()}

    weird: list[object] = [None, -1, 0, 2**70, 1e308, "x", [], [1.5, "a"], {"a": 1}, True]
    base = {"posenc_audit_extract": 1, "source": "gguf", "context_length": 64, "rotary_dim": 8, "head_dim": 8}
    cases: list[dict[str, object]] = [{**base, "source": source, name: value} for source in ("gguf", "config.json", 5)
                                      for name in [*SCALARS, "scaling", "sections", "learned_positions"]
                                      for value in weird]
    cases += [{**base, name: array(shape)} for name in ("inv_freq", "freq_factors", "long_factors", "alibi_slopes")
              for shape in ([], [0], [4], [2, 4], [3, 4], [1, 1, 4])]
    cases += [{**base, "caches": {"cos": array(shape), "sin": array([4, 4])}} for shape in ([4, 4], [4], [0, 4])]
    return cases


def test_hostile_extracts_are_refused_or_audited_never_a_500() -> None:
    import json

    from tests.conftest import running_client

    statuses = set()
    with running_client() as client:
        for case in _extract_cases()[::3]:
            for preset in (None, "phi-3.5-mini-instruct"):
                response = client.post("/v1/audit", params={"preset": preset} if preset else {},
                                       content=json.dumps(case))
                assert response.status_code < 500, (case, preset, response.text)
                statuses.add(response.status_code)
    assert 400 in statuses and 200 in statuses
