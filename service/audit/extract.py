"""The extract: a `Found` as JSON (arrays as base64 with dtype and shape), what `posenc audit --remote` sends
instead of the file, and what `POST /v1/audit` reads back (checked field by field)."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from posenc.models.audit.found import SCALING_FIELDS, Caches, Found
from posenc.service.audit import values
from posenc.service.audit_limits import MAX_LAYER_TYPES
from posenc.service.errors import BadRequest

MARK = "posenc_audit_extract"
ARRAYS = ("inv_freq", "freq_factors", "long_factors", "short_factors", "alibi_slopes")
SCALARS = ("architecture", "context_length", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "key_length_mla",
           "rotary_dim", "rope_theta", "theta_swa", "attention_factor", "interleaved", "learned_name")
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
    if not isinstance(entry, dict) or not isinstance(entry.get("data"), str) or entry.get("dtype") not in DTYPES:
        raise BadRequest(f"extract: {name} must be an object of dtype ({', '.join(DTYPES)}), shape and base64 data")
    dtype, shape = DTYPES[entry["dtype"]], values.shape(f"extract: {name}.shape", entry.get("shape"))
    try:
        raw = base64.b64decode(entry["data"], validate=True)
    except ValueError:
        raise BadRequest(f"extract: {name}.data is not base64") from None
    if len(raw) != math.prod(shape) * dtype.itemsize:
        raise BadRequest(f"extract: {name}.data holds {len(raw)} bytes; its shape {list(shape)} of {entry['dtype']} "
                         f"needs {math.prod(shape) * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


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
    if found.layer_type is not None:
        out["layer_type"], out["inherited"] = found.layer_type, list(found.inherited)
    if found.layers:
        out["layers"] = {name: dump(layer) for name, layer in found.layers.items()}
    return out


INTS = ("context_length", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "key_length_mla", "rotary_dim")
INHERITED = frozenset({"head_dim", "rotary_dim", "rope_theta"})  # what a layer type's facts may take from the others
FLOATS = ("rope_theta", "theta_swa", "attention_factor")
TEXT = ("architecture", "learned_name")


def _scalar(name: str, value: Any) -> Any:
    if value is None:
        return None
    if name in INTS:
        return values.integer(f"extract: {name}", value)
    if name in FLOATS:
        return values.number(f"extract: {name}", value)
    if name in TEXT and isinstance(value, str):
        return value[:200]
    if name == "interleaved" and isinstance(value, bool):
        return value
    raise BadRequest(f"extract: {name} must be {'a string' if name in TEXT else 'a boolean'}")


def _scaling(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest("extract: scaling must be an object")
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key not in SCALING_FIELDS:
            raise BadRequest(f"extract: scaling.{str(key)[:40]} is not a scaling field (allowed: "
                             f"{', '.join(sorted(SCALING_FIELDS))})")
        plain = isinstance(item, int | float | str | bool) or item is None
        numbers = isinstance(item, list) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in item)
        if not (plain or numbers):
            raise BadRequest(f"extract: scaling.{str(key)[:40]} must be a number, a string or a list of numbers")
        out[str(key)] = tuple(item) if isinstance(item, list) else item
    return out


NAME = 64  # characters of a layer type's name


def _layer_type(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > NAME:
        raise BadRequest(f"extract: {what} must be a layer type's name (a string of 1 to {NAME} characters)")
    return value


def _layers(value: Any) -> dict[str, Found]:
    """The facts of each layer type the file states apart: {name: an extract of its own, without layers}."""
    if not isinstance(value, dict) or len(value) > MAX_LAYER_TYPES:
        raise BadRequest(f"extract: layers must be an object of at most {MAX_LAYER_TYPES} layer types")
    out = {}
    for name, layer in value.items():
        if not isinstance(layer, dict):
            raise BadRequest("extract: each entry of layers must be an object")
        out[_layer_type(name, "a key of layers")] = load(layer, nested=True)
    return out


def load(document: Mapping[str, Any], nested: bool = False) -> Found:
    """The extract's Found, every field checked for its type and every array for its rank (`nested`: a layer type's
    facts, which hold no layers of their own)."""
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
            setattr(found, name, values.integers(f"extract: {name}", value))
    for name in values.RANKS:
        if document.get(name) is not None:
            array = _from_array(document[name], name)
            values.position_shape(f"extract: {name}", name, array.shape)
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
    if document.get("layer_type") is not None:
        found.layer_type = _layer_type(document["layer_type"], "layer_type")
        inherited = document.get("inherited") or []
        if not isinstance(inherited, list) or not all(isinstance(i, str) and i in INHERITED for i in inherited):
            raise BadRequest(f"extract: inherited must be a list of {', '.join(sorted(INHERITED))}")
        found.inherited = tuple(inherited)
    if document.get("layers") is not None:
        if nested:
            raise BadRequest("extract: a layer type's facts hold no layers")
        found.layers = _layers(document["layers"])
    return found
