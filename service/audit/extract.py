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


INTS = ("context_length", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "rotary_dim")
FLOATS = ("rope_theta", "theta_swa", "attention_factor")
TEXT = ("architecture", "learned_name")
# arrays by the ranks they may have: inv_freq [n] or a short/long pair [2, n]
RANKS = {"inv_freq": (1, 2), "freq_factors": (1,), "long_factors": (1,), "short_factors": (1,), "alibi_slopes": (1,)}


def _scalar(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in INTS and isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if name in FLOATS and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if name in TEXT and isinstance(value, str):
        return value[:200]
    if name == "interleaved" and isinstance(value, bool):
        return value
    kind = "a positive integer" if name in INTS else "a number" if name in FLOATS else "a string" \
        if name in TEXT else "a boolean"
    raise BadRequest(f"extract: {name} must be {kind}")


def _scaling(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest("extract: scaling must be an object")
    out: dict[str, Any] = {}
    for key, item in value.items():
        plain = isinstance(item, int | float | str | bool) or item is None
        numbers = isinstance(item, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in item)
        if not (plain or numbers):
            raise BadRequest(f"extract: scaling.{str(key)[:40]} must be a number, a string or a list of numbers")
        out[str(key)] = tuple(item) if isinstance(item, list) else item
    return out


def load(document: Mapping[str, Any]) -> Found:
    """The extract's Found, every field checked for its type and every array for its rank."""
    source = document.get("source")
    if source not in SOURCES:
        raise BadRequest(f"extract: source must be one of {', '.join(SOURCES)}")
    found = Found(str(source))
    for name in SCALARS:
        setattr(found, name, _scalar(name, document.get(name)))
    found.scaling = _scaling(document.get("scaling") or {})
    for name in ("sections", "learned_positions"):
        value = document.get(name)
        if value is not None:
            if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                      for v in value) or len(value) > 8:
                raise BadRequest(f"extract: {name} must be a list of at most 8 non-negative integers")
            setattr(found, name, tuple(value))
    for name, ranks in RANKS.items():
        if document.get(name) is not None:
            array = _from_array(document[name], name)
            if array.ndim not in ranks or array.size == 0 or (array.ndim == 2 and array.shape[0] != 2):
                raise BadRequest(f"extract: {name} must be a non-empty vector" + (" or a [2, n] pair" if 2 in ranks
                                                                                 else ""))
            setattr(found, name, array)
    caches = document.get("caches")
    if caches is not None:
        if not isinstance(caches, dict):
            raise BadRequest("extract: caches must be an object with cos and sin")
        cos, sin = _from_array(caches.get("cos"), "caches.cos"), _from_array(caches.get("sin"), "caches.sin")
        if cos.ndim != 2 or cos.shape != sin.shape or cos.size == 0:
            raise BadRequest("extract: caches.cos and caches.sin must be non-empty [rows, n] of one shape")
        found.caches = Caches(cos, sin, found.interleaved)
    notes = document.get("notes") or []
    found.notes = [str(n)[:500] for n in notes[:64]] if isinstance(notes, list) else []
    return found
