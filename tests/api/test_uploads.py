"""Uploaded-tensor decoders: round trips, and every way a body can lie about itself."""

import asyncio
import io
import json
import pickle
import struct
from collections.abc import AsyncIterator

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save as safetensors_save

from posenc.service.codec.decode import decode_npy, decode_safetensors, decode_tensor, upload_format
from posenc.service.errors import BadRequest, PayloadTooLarge, UnsupportedMediaType
from posenc.service.request_kit.bodies import read_body


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def npy_with_header(header: str, data: bytes = b"", version: int = 1) -> bytes:
    raw = header.encode("utf-8" if version == 3 else "latin-1")
    length = struct.pack("<H" if version == 1 else "<I", len(raw))
    return b"\x93NUMPY" + bytes([version, 0]) + length + raw + data


def safetensors_with_header(header: object, data: bytes, header_len: int | None = None) -> bytes:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data


ARRAYS = [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.linspace(-1, 1, 10).reshape(5, 2),
    np.arange(6, dtype=np.float16).reshape(2, 3),
    np.arange(8, dtype=np.int64),
    np.arange(8, dtype=np.int32).reshape(2, 2, 2),
    np.zeros((0, 4), np.float32),
    np.array(2.5),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_round_trips(array: np.ndarray) -> None:
    for got in (decode_npy(npy_bytes(array)), decode_safetensors(safetensors_save({"weight": array}))):
        assert got.dtype == array.dtype and got.shape == array.shape
        assert got.flags.c_contiguous and got.flags.writeable and got.dtype.isnative
        np.testing.assert_array_equal(got, array)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_npy_versions_byte_order_and_fortran(version: int) -> None:
    expected = np.arange(6, dtype=np.float64).reshape(2, 3)
    data = expected.astype(">f8").tobytes(order="F")  # column-major: 0, 3, 1, 4, 2, 5
    header = "{'descr': '>f8', 'fortran_order': True, 'shape': (2, 3), }"
    got = decode_npy(npy_with_header(header, data, version))
    np.testing.assert_array_equal(got, expected)
    assert got.dtype == np.float64 and got.dtype.isnative and got.flags.c_contiguous


def test_safetensors_bfloat16_and_tensor_choice() -> None:
    weight = np.arange(6, dtype=np.float32).reshape(3, 2).astype(ml_dtypes.bfloat16)
    got = decode_safetensors(safetensors_save({"other": np.ones(2), "weight": weight}))
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, weight)
    np.testing.assert_array_equal(decode_safetensors(safetensors_save({"only": weight})), weight)
    with pytest.raises(BadRequest, match="found a, b"):
        decode_safetensors(safetensors_save({"a": np.ones(1), "b": np.ones(1)}))


GOOD_NPY = npy_bytes(np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.parametrize(("body", "words"), [
    (GOOD_NPY[:5], "magic"),
    (GOOD_NPY[:6], "truncated: 6 bytes, the fixed prelude alone is 10"),
    (GOOD_NPY[:8], "truncated: 8 bytes, the fixed prelude alone is 10"),
    (b"\x93NUMPY\x02\x00\x00\x00", "truncated: 10 bytes, the version 2.0 prelude is 12"),
    (b"\x93NUMPY\x01\x00\x00\x00", "literal"),  # the prelude and an empty header
    (b"\x93NUMPY\x03\x00" + struct.pack("<I", 4) + b"{\xff\xfe}", "header is not valid utf-8"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1, " * 33 + "), }", b"\0" * 4),
     "at most 32"),
    (GOOD_NPY[:40], "truncated header"),
    (GOOD_NPY[:-1], "48 bytes"),
    (GOOD_NPY + b"\0", "48 bytes"),
    (b"\x93NUMPY\x04\x00" + GOOD_NPY[8:], "version 4.0"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), }", b"\0" * 48), "60 bytes"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 4), }", b"\0" * 48), "non-negative"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (True, 4), }", b"\0" * 16),
     "non-negative"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }", b"\0" * 16),
     "bytes of data"),
    (npy_with_header("{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", b"\0" * 8), "allow_pickle"),
    (npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", b"\0" * 4),
     "structured"),
    (npy_with_header("{'descr': '<U3', 'fortran_order': False, 'shape': (1,), }", b"\0" * 12), "not accepted"),
    (npy_with_header("{'descr': '<V2', 'fortran_order': False, 'shape': (1,), }", b"\0" * 2), "not accepted"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }", b"\0" * 4), "fortran_order"),
    (npy_with_header("{'descr': '<f4', 'shape': (1,), }", b"\0" * 4), "exactly the keys"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", b"\0" * 4),
     "exactly the keys"),
    (npy_with_header("__import__('os').system('true')", b""), "literal"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': " + "(" * 200 + ")" * 200 + "}"),
     "literal|shape"),
    (npy_with_header(" " * 20000), "limit"),
    (b"\x93NUMPY\x01\x00" + struct.pack("<H", 5000) + b"{", "truncated header"),
    (b"\x93NUMPY\x02\x00" + struct.pack("<I", 2**31) + b"{", "limit"),
    (npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }".replace("'", "\xff"), b""),
     "literal"),
], ids=lambda value: value if isinstance(value, str) else f"{len(value)}B")
def test_bad_npy_is_a_clear_400(body: bytes, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        decode_npy(body)


def test_pickled_payloads_are_never_unpickled() -> None:
    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("unpickled!",))

    buffer = io.BytesIO()
    np.save(buffer, np.array([Boom()], dtype=object), allow_pickle=True)
    with pytest.raises(BadRequest, match="allow_pickle"):
        decode_npy(buffer.getvalue())
    with pytest.raises(BadRequest):
        decode_tensor(pickle.dumps(np.ones(3)), "application/x-npy")
    with pytest.raises(BadRequest):
        decode_tensor(pickle.dumps(np.ones(3)), "application/octet-stream")


F32x4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


@pytest.mark.parametrize(("body", "words"), [
    (b"\x01\x00", "truncated"),
    (b"\0" * 8, "JSON"),  # the length field alone, declaring an empty header
    (safetensors_with_header({"weight": F32x4}, b"\0" * 16, header_len=10**6), "exceeds the body"),
    (safetensors_with_header({"weight": F32x4}, b"\0" * 16, header_len=2**63), "exceeds the body"),
    (safetensors_with_header(b"[1, 2]", b""), "JSON object"),
    (safetensors_with_header(b"{\"weight\": ", b""), "JSON"),
    (safetensors_with_header(b"\xff\xfe{}", b""), "UTF-8"),
    (safetensors_with_header(b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                             b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', b"\0" * 8), "duplicate"),
    (safetensors_with_header({"weight": F32x4}, b"\0" * 12), "data_offsets"),
    (safetensors_with_header({"weight": F32x4}, b"\0" * 20), "cover 16 bytes"),
    (safetensors_with_header({"weight": {**F32x4, "shape": [5]}}, b"\0" * 16), "needs 20"),
    (safetensors_with_header({"weight": {**F32x4, "shape": [-4]}}, b"\0" * 16), "non-negative"),
    (safetensors_with_header({"weight": {**F32x4, "shape": [2**62, 2**62]}}, b"\0" * 16), "needs"),
    (safetensors_with_header({"weight": {**F32x4, "shape": "4"}}, b"\0" * 16), "shape"),
    (safetensors_with_header({"weight": {**F32x4, "dtype": "F8_E4M3"}}, b"\0" * 16), "accepted"),
    (safetensors_with_header({"weight": {**F32x4, "data_offsets": [16, 0]}}, b"\0" * 16), "data_offsets"),
    (safetensors_with_header({"weight": {**F32x4, "data_offsets": [-16, 0]}}, b"\0" * 16), "data_offsets"),
    (safetensors_with_header({"weight": {**F32x4, "data_offsets": [0, 16.0]}}, b"\0" * 16), "data_offsets"),
    (safetensors_with_header({"weight": {"dtype": "F32", "shape": [4]}}, b"\0" * 16), "exactly"),
    (safetensors_with_header({"a": F32x4, "weight": F32x4}, b"\0" * 16), "overlaps"),
    (safetensors_with_header({"a": {**F32x4, "data_offsets": [0, 16]},
                              "weight": {**F32x4, "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16), "overlaps"),
    (safetensors_with_header({"weight": {**F32x4, "shape": [2], "data_offsets": [8, 16]}}, b"\0" * 16), "hole"),
    (safetensors_with_header({"__metadata__": {"a": 1}, "weight": F32x4}, b"\0" * 16), "__metadata__"),
], ids=lambda value: value if isinstance(value, str) else f"{len(value)}B")
def test_bad_safetensors_is_a_clear_400(body: bytes, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        decode_safetensors(body)


@pytest.mark.parametrize(("content_type", "body", "expected"), [
    ("application/x-npy", GOOD_NPY, "npy"),
    ("application/x-safetensors; charset=binary", b"", "safetensors"),
    ("Application/X-NPY", b"", "npy"),
    ("application/octet-stream", GOOD_NPY, "npy"),
    (None, safetensors_save({"w": np.ones(2)}), "safetensors"),
])
def test_content_type_chooses_and_octet_stream_is_sniffed(content_type: str | None, body: bytes,
                                                          expected: str) -> None:
    assert upload_format(content_type, body[:16]) == expected


def test_unknown_content_type_is_415_and_unknown_bytes_400() -> None:
    with pytest.raises(UnsupportedMediaType, match="application/x-npy"):
        upload_format("text/csv", GOOD_NPY)
    with pytest.raises(BadRequest, match="neither"):
        upload_format("application/octet-stream", b"PK\x03\x04 a zip file")


async def chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def test_body_limit() -> None:
    assert asyncio.run(read_body("6", chunks([b"abc", b"def"]), 6)) == b"abcdef"
    with pytest.raises(PayloadTooLarge, match="7 bytes"):
        asyncio.run(read_body("7", chunks([]), 6))  # refused before reading anything
    with pytest.raises(PayloadTooLarge, match="at least 8"):
        asyncio.run(read_body(None, chunks([b"abcd", b"efgh", b"never read"]), 6))
    with pytest.raises(BadRequest, match="Content-Length"):
        asyncio.run(read_body("lots", chunks([]), 6))


@pytest.mark.parametrize("kind", ["npy", "safetensors"])
def test_mutated_bodies_decode_or_fail_with_400(kind: str) -> None:
    """Random truncations and header byte flips: a valid array or a BadRequest, never another error."""
    array = np.arange(24, dtype=np.float32).reshape(4, 6)
    good = npy_bytes(array) if kind == "npy" else safetensors_save({"weight": array})
    header_end = 128 if kind == "npy" else 8 + int(struct.unpack_from("<Q", good)[0])
    rng = np.random.default_rng(1234)
    outcomes = {"decoded": 0, "rejected": 0}
    for _ in range(600):
        body = bytearray(good)
        if rng.random() < 0.3:
            body = body[: int(rng.integers(0, len(body)))]
        for _ in range(int(rng.integers(1, 4))):
            if body:
                body[int(rng.integers(0, min(header_end, len(body))))] = int(rng.integers(0, 256))
        try:
            got = decode_tensor(bytes(body), f"application/x-{kind}")
        except BadRequest:
            outcomes["rejected"] += 1
        else:
            assert isinstance(got, np.ndarray) and got.nbytes <= len(body)
            outcomes["decoded"] += 1
    assert outcomes["rejected"] > 100  # and nothing else escaped
