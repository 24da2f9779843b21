"""The extract: a `Found` as JSON (arrays as base64 with dtype and shape), what `posenc audit --remote` sends
instead of the file, and what `POST /v1/audit` reads back (checked field by field)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from posenc.models.audit.found import Caches, Found
from posenc.service.errors import BadRequest

MARK = "posenc_audit_extract"
ARRAYS = ("inv_freq", "freq_factors", "long_factors", "short_factors", "alibi_slopes")
SCALARS = ("architecture", "context_length", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "rotary_dim",
           "rope_theta", "theta_swa", "attention_factor", "interleaved", "learned_name")
DTYPES = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2"), "float64": np.dtype("<f8"),
          "bfloat16": np.dtype(ml_dtypes.bfloat16)}
SOURCES = ("gguf", "onnx", "safetensors", "config.json")


def _array(value: np.ndarray) -> dict[str, Any]:
    dtype = str(value.dtype)
    if dtype not in DTYPES:
        value, dtype = value.astype(np.float32), "float32"
    return {"dtype": dtype, "shape": list(value.shape), "data": base64.b64encode(np.ascontiguousarray(value)
                                                                                  .tobytes()).decode()}


def _from_array(entry: Any, name: str) -> np.ndarray:
    try:
        dtype, shape = DTYPES[entry["dtype"]], [int(d) for d in entry["shape"]]
        raw = base64.b64decode(entry["data"], validate=True)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRequest(f"extract: {name} is not an array of the extract's form ({type(exc).__name__})") from None


def dump(found: Found) -> dict[str, Any]:
    out: dict[str, Any] = {MARK: 1, "source": found.source, "notes": list(found.notes)}
    for name in SCALARS:
        out[name] = getattr(found, name)
    out["scaling"] = {k: list(v) if isinstance(v, tuple) else v for k, v in found.scaling.items()}
    out["sections"] = None if found.sections is None else list(found.sections)
    out["learned_positions"] = None if found.learned_positions is None else list(found.learned_positions)
    for name in ARRAYS:
        value = getattr(found, name)
        out[name] = None if value is None else _array(value)
    if found.caches is not None:
        out["caches"] = {"cos": _array(found.caches.cos), "sin": _array(found.caches.sin)}
    return out


def load(document: Mapping[str, Any]) -> Found:
    source = document.get("source")
    if source not in SOURCES:
        raise BadRequest(f"extract: source must be one of {', '.join(SOURCES)}")
    found = Found(str(source))
    for name in SCALARS:
        value = document.get(name)
        if value is not None and not isinstance(value, int | float | str | bool):
            raise BadRequest(f"extract: {name} must be a number, a string or a boolean")
        setattr(found, name, value)
    scaling = document.get("scaling") or {}
    if not isinstance(scaling, dict):
        raise BadRequest("extract: scaling must be an object")
    found.scaling = {str(k): tuple(v) if isinstance(v, list) else v for k, v in scaling.items()}
    for name in ("sections", "learned_positions"):
        value = document.get(name)
        if value is not None:
            if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
                raise BadRequest(f"extract: {name} must be a list of integers")
            setattr(found, name, tuple(value))
    for name in ARRAYS:
        if document.get(name) is not None:
            setattr(found, name, _from_array(document[name], name))
    caches = document.get("caches")
    if caches is not None:
        if not isinstance(caches, dict):
            raise BadRequest("extract: caches must be an object with cos and sin")
        found.caches = Caches(_from_array(caches.get("cos"), "caches.cos"), _from_array(caches.get("sin"),
                                                                                        "caches.sin"),
                              found.interleaved)
    found.notes = [str(n) for n in document.get("notes") or []][:64]
    return found
