"""Wire-format encoders decoded by the reference readers (safetensors, numpy) and by hand (plain JSON)."""

import io
import json
import struct

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load as safetensors_load

from posenc.service.codec.encode import (
    decode_json_tensor,
    encode_json,
    encode_npy,
    encode_raw,
    encode_safetensors,
    negotiate_format,
    npy_header,
)
from posenc.service.errors import NotAcceptable
from posenc.service.tables.cache import ByteLRUCache, CachedBody

SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (1, 1, 1, 9)]
DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int32, np.int8, np.uint8, np.bool_]


def sample(shape: tuple[int, ...], dtype: type) -> np.ndarray:
    rng = np.random.default_rng(len(shape))
    return np.asarray(rng.standard_normal(shape) * 100).astype(dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_npy_roundtrip_with_numpy(shape: tuple[int, ...], dtype: type) -> None:
    array = sample(shape, dtype)
    body = encode_npy(array)
    loaded = np.load(io.BytesIO(body), allow_pickle=False)
    assert loaded.dtype == array.dtype and loaded.shape == array.shape
    np.testing.assert_array_equal(loaded, array)
    header_len = struct.unpack("<H", body[8:10])[0]
    assert (10 + header_len) % 64 == 0  # data 64-byte aligned, as numpy writes it
    saved = io.BytesIO()
    np.save(saved, array, allow_pickle=False)
    assert body == saved.getvalue()  # byte for byte what numpy writes ('|' only for one-byte types)


def test_npy_header_switches_to_v2_when_large() -> None:
    header = npy_header(np.dtype(np.float32), tuple([1] * 30000))
    assert header[6] == 2 and len(header) % 64 == 0
    parsed = np.lib.format.read_array_header_2_0(io.BytesIO(header[8:]), max_header_size=1 << 20)
    assert parsed == (tuple([1] * 30000), False, np.dtype(np.float32))


def test_npy_rejects_bfloat16() -> None:
    with pytest.raises(ValueError, match="bfloat16"):
        encode_npy(np.zeros(3, dtype=ml_dtypes.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_safetensors_roundtrip_with_reference_reader(dtype: type) -> None:
    tensors = {f"t{i}": sample(shape, dtype) for i, shape in enumerate(SHAPES)}
    body = encode_safetensors(tensors, {"a": "1", "b": "x"})
    loaded = safetensors_load(body)
    assert set(loaded) == set(tensors)
    for name, array in tensors.items():
        np.testing.assert_array_equal(loaded[name], array)
        assert loaded[name].dtype == array.dtype


def test_safetensors_header_is_plain_json_with_contiguous_offsets() -> None:
    tensors = {"cos": np.ones((4, 3), np.float32), "inv_freq": np.arange(2, dtype=np.float32)}
    body = encode_safetensors(tensors, {"rope_type": "default"})
    (n,) = struct.unpack("<Q", body[:8])
    assert n % 8 == 0
    header = json.loads(body[8:8 + n])
    assert header["__metadata__"] == {"rope_type": "default"}
    assert header["cos"] == {"dtype": "F32", "shape": [4, 3], "data_offsets": [0, 48]}
    assert header["inv_freq"]["data_offsets"] == [48, 56]
    assert len(body) == 8 + n + 56
    data = np.frombuffer(body[8 + n + 48:], dtype="<f4")
    np.testing.assert_array_equal(data, [0, 1])


BF16 = np.array([[1.0, -2.5], [0.15625, 3e38]], dtype=ml_dtypes.bfloat16)


def test_bfloat16_in_safetensors_and_raw() -> None:
    header = json.loads(encode_safetensors({"x": BF16}, {})[8:].split(b"}}")[0] + b"}}")
    assert header["x"]["dtype"] == "BF16"
    raw = encode_raw(BF16)
    assert raw == BF16.view(np.uint16).astype("<u2").tobytes()




def test_raw_is_little_endian_c_order_even_for_other_inputs() -> None:
    big_endian_fortran = np.asfortranarray(np.arange(6, dtype=">i4").reshape(2, 3))
    assert encode_raw(big_endian_fortran) == np.arange(6, dtype="<i4").tobytes()


def test_json_roundtrip_and_non_finite_values() -> None:
    array = np.array([[0.0, -np.inf], [np.inf, np.nan]], dtype=np.float32)
    doc = json.loads(encode_json({"bias": array}, {"k": "v"}))
    assert doc["tensors"]["bias"]["data"] == [0.0, "-Infinity", "Infinity", "NaN"]
    back = decode_json_tensor(doc["tensors"]["bias"])
    np.testing.assert_array_equal(back, array)
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    doc = json.loads(encode_json({"i": ints}, {}))
    assert doc["tensors"]["i"] == {"dtype": "int32", "shape": [2, 3], "data": [0, 1, 2, 3, 4, 5]}


def test_json_float32_values_roundtrip_exactly() -> None:
    array = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    doc = json.loads(encode_json({"x": array}, {}))
    np.testing.assert_array_equal(decode_json_tensor(doc["tensors"]["x"]), array)


@pytest.mark.parametrize(("format_param", "accept", "expected"), [
    (None, None, "safetensors"),
    (None, "", "safetensors"),
    (None, "*/*", "safetensors"),
    (None, "application/x-npy", "npy"),
    (None, "application/json", "json"),
    (None, "application/octet-stream", "raw"),
    (None, "text/html, application/json;q=0.9, */*;q=0.8", "json"),
    (None, "application/x-npy;q=0.5, application/json;q=0.9", "json"),
    (None, "application/x-npy;q=0, */*", "safetensors"),
    ("raw", "application/json", "raw"),
])
def test_negotiation(format_param: str | None, accept: str | None, expected: str) -> None:
    assert negotiate_format(format_param, accept) == expected


@pytest.mark.parametrize(("format_param", "accept"), [("xml", None), ("NPY", None), (None, "text/html"),
                                                      (None, "application/json;q=0")])
def test_negotiation_rejects(format_param: str | None, accept: str | None) -> None:
    with pytest.raises(NotAcceptable):
        negotiate_format(format_param, accept)


def test_lru_cache_is_byte_bounded() -> None:
    def entry(n: int) -> CachedBody:
        return CachedBody(body=b"x" * n, media_type="application/octet-stream")

    unit = entry(40).cost("a")  # every entry's real cost: body, key, strings, the objects around them
    assert unit > 40 + len("a") + len("application/octet-stream")
    cache = ByteLRUCache(2 * unit + unit // 2)
    cache.put("a", entry(40))
    cache.put("b", entry(40))
    assert cache.get("a") is not None  # a is now most recent
    cache.put("c", entry(40))  # evicts b, the least recently used
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.size_bytes == 2 * unit
    cache.put("huge", entry(3 * unit))  # larger than the budget: not stored, nothing evicted
    assert cache.get("huge") is None and len(cache) == 2
    cache.put("a", entry(10))  # replacing an entry updates the byte count
    assert cache.size_bytes == unit + entry(10).cost("a")
    assert (cache.hits, cache.misses) == (3, 2)
