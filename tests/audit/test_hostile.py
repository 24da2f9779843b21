"""Truncated and hostile files get a clear 400 within a time and memory bound: lying offsets, tensor sizes past
the end, 2^32 metadata entries, huge strings and arrays, recursion in ONNX functions, bytes that are no model."""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import pytest

from posenc.service.audit.run import read_path
from posenc.service.errors import BadRequest, PayloadTooLarge
from posenc.service.settings import Settings
from tests.audit_files import llama3_rope_factors, llama_gguf_meta, write_gguf


def _gguf_head(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def _string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _refused(path: Path, *words: str) -> str:
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises((BadRequest, PayloadTooLarge)) as caught:
        read_path(path, Settings())
    elapsed, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 2.0 and peak < 80 << 20, (elapsed, peak)
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
    info = _string(b"rope_freqs.weight") + struct.pack("<IQIQ", 1, 64, 0, 1 << 50)
    path.write_bytes(_gguf_head(1, 1) + _string(b"general.architecture") + struct.pack("<I", 8) + _string(b"llama")
                     + info + bytes(64))
    _refused(path, "past the end")


def test_safetensors_lying_offsets(tmp_path: Path) -> None:
    header = b'{"model.rotary_emb.inv_freq": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1099511627776]}}'
    path = tmp_path / "lie.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    _refused(path)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 60) + b"{")
    _refused(huge, "header")


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
