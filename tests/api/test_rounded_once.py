"""Every served float element is the float64 value rounded once to the served dtype, bit for bit: every GET
table and properties route (from the OpenAPI document), at sizes where double rounding shows, in float32,
float16 and bfloat16.

The reference rounding is written here independently of models/dtypes.py: round-to-nearest-even on the
float64 bit pattern (dropping the mantissa bits the target lacks), exact where the target's value is normal;
elsewhere (subnormal targets) the nearest of the neighbouring values, compared as exact rationals."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any
from urllib.parse import urlencode

import ml_dtypes
import numpy as np
import pytest

from posenc.models.dtypes import BY_SAFETENSORS
from tests.api.test_cache_keys import BASE, _openapi
from tests.conftest import running_client

TARGETS = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
           "bfloat16": np.dtype(ml_dtypes.bfloat16)}
MANTISSA_BITS = {"float32": 23, "float16": 10, "bfloat16": 7}
SMALLEST_NORMAL = {name: float(ml_dtypes.finfo(dtype).smallest_normal) for name, dtype in TARGETS.items()}
# Sizes at which double rounding is seen (RoPE 4096 × 128 in bfloat16: 6 of 524,288 elements in cos).
LARGER = {"max_position": 4096, "head_dim": 128, "dim": 128, "query_length": 256, "key_length": 256, "qlen": 128,
          "klen": 128, "d_model": 128, "num_heads": 16, "image_size": 1024, "patch_size": 16}


def _routes_with_dtype() -> list[str]:
    doc = _openapi()
    return [path for path in BASE if any(p["name"] == "dtype" and "float16" in str(p.get("schema"))
                                         for p in doc["paths"][path]["get"].get("parameters", []))]


def rounded_once(values: np.ndarray, name: str) -> np.ndarray:
    """float64 [...] -> `name` [...], each element rounded to nearest, ties to even, from its float64 value."""
    drop = 52 - MANTISSA_BITS[name]
    bits = values.view(np.uint64)
    half, lsb = np.uint64(1 << (drop - 1)), (bits >> np.uint64(drop)) & np.uint64(1)
    kept = (bits + half - np.uint64(1) + lsb) & ~np.uint64((1 << drop) - 1)  # RNE in the float64 pattern
    out = kept.view(np.float64).astype(np.float32).astype(TARGETS[name])  # exact: representable (or inf)
    tiny = np.isfinite(values) & (np.abs(values) < SMALLEST_NORMAL[name])
    for index in zip(*np.nonzero(tiny), strict=True):
        out[index] = _nearest_by_fractions(float(values[index]), TARGETS[name])
    return out


def _nearest_by_fractions(value: float, dtype: np.dtype) -> Any:
    first = np.array([value]).astype(np.float32).astype(dtype)
    pattern = int(first.view(np.uint16 if dtype.itemsize == 2 else np.uint32)[0])
    width = np.uint16 if dtype.itemsize == 2 else np.uint32
    candidates = [np.array([pattern + step], dtype=width).view(dtype)[0] for step in (-1, 0, 1)
                  if 0 <= pattern + step < (1 << (8 * dtype.itemsize))]
    exact = Fraction(value)
    return min(candidates, key=lambda c: (abs(Fraction(float(c)) - exact),
                                          int(np.array([c], dtype=dtype).view(width)[0]) & 1))


def _tables(client: Any, route: str, dtype: str) -> dict[str, np.ndarray]:
    params = {**BASE[route], **{k: v for k, v in LARGER.items() if k in BASE[route]}, "dtype": dtype,
              "format": "safetensors"}
    answer = client.get(f"{route}?{urlencode(params)}")
    assert answer.status_code == 200, answer.text
    return _safetensors(answer.content)


def _safetensors(body: bytes) -> dict[str, np.ndarray]:
    """The tensors of a safetensors body (the library's numpy loader has no bfloat16)."""
    size = int.from_bytes(body[:8], "little")
    header, data = json.loads(body[8:8 + size]), body[8 + size:]
    header.pop("__metadata__", None)
    return {name: np.frombuffer(data[entry["data_offsets"][0]:entry["data_offsets"][1]],
                                dtype=BY_SAFETENSORS[entry["dtype"]].numpy).reshape(entry["shape"])
            for name, entry in header.items()}


@pytest.mark.parametrize("dtype", list(TARGETS))
@pytest.mark.parametrize("route", _routes_with_dtype())
def test_every_element_is_rounded_once(route: str, dtype: str) -> None:
    with running_client(cache_bytes=0) as client:
        exact, served = _tables(client, route, "float64"), _tables(client, route, dtype)
    # the tensors served in the requested dtype (a properties route measures its table in float64: those
    # measures are not casts; the table they measure is cast by the same function as every table)
    floats = [name for name, array in served.items()
              if array.dtype == TARGETS[dtype] and exact[name].dtype == np.float64]  # (inv_freq: float32 always)
    if route.startswith("/v1/properties/") and not floats:
        pytest.skip(f"{route} serves its measures in float64 whatever the table's dtype")
    assert floats, f"{route} serves no tensor in {dtype}"
    for name in floats:
        expected = rounded_once(exact[name], dtype)
        width = np.uint16 if TARGETS[dtype].itemsize == 2 else np.uint32
        wrong = np.nonzero(served[name].view(width) != expected.view(width))
        assert wrong[0].size == 0, (f"{route} {name} {dtype}: {wrong[0].size} elements not rounded once, e.g. "
                                    f"{float(exact[name][tuple(w[0] for w in wrong)])!r} served as "
                                    f"{float(served[name][tuple(w[0] for w in wrong)])!r}")


def test_the_reported_element() -> None:
    """cos[1640, 25] of RoPE 4096 × 128 (theta 10000): 0.5996093575939561 is 0.59765625 in bfloat16, not the
    0.6015625 that rounding through float32 gives."""
    with running_client() as client:
        data = client.get("/v1/rope?max_position=4096&head_dim=128&dtype=bfloat16&format=raw&tensor=cos").content
    cos = np.frombuffer(data, dtype=ml_dtypes.bfloat16).reshape(4096, 128)
    assert float(cos[1640, 25]) == 0.59765625
