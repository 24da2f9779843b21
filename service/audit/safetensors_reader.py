"""safetensors checkpoints, read within bounds: the JSON header, then only the position tensors it names
(`*.rotary_emb.inv_freq` buffers, those of each layer type, ALiBi slopes); learned position tables (`wpe`,
`embed_positions`) are judged by their shape, read from the header alone."""

from __future__ import annotations

import re
from typing import Any

import ml_dtypes
import numpy as np

from posenc.models.audit.found import Found
from posenc.service.audit import values
from posenc.service.audit.stream import Cursor, Layout
from posenc.service.audit_limits import MAX_LAYER_TYPES
from posenc.service.codec import safetensors_header
from posenc.service.errors import BadRequest

DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16), "F64": np.dtype("<f8")}
LEARNED = ("wpe.weight", "embed_positions.weight", "position_embeddings.weight")
MAX_SMALL = 1 << 16  # values of a tensor read for its values
# A shard of a large checkpoint lists a few hundred to a few thousand tensors (Llama 3.1 405B: about 1,300 per
# shard); a whole model in one file lists fewer than 100,000 (DeepSeek-V3, every expert apart with its scales:
# about 92,000). An entry, `"name": {"dtype": "BF16", "shape": [a, b], "data_offsets": [c, d]}`, counts 6 JSON
# values (`{`, two `[`, three `,`) and one `,` per dimension, 14 at the rank of 8 read; `__metadata__` maps
# strings to strings. The header is nested 3 deep. The bounds are above any real file, and keep the parse of a
# hostile header (48 MiB of `{}`: 1.5 GB of dicts) to about 200 MB at most.
MAX_TENSORS = 1 << 17
HEADER_LIMITS = values.JsonLimits(values=14 * MAX_TENSORS, depth=8, members=MAX_TENSORS, entries="tensors")


# transformers 5's rotary modules of a model with RoPE per layer type hold one buffer per layer type,
# `f"{layer_type}_inv_freq"` (models/gemma3/modeling_gemma3.py, Gemma3RotaryEmbedding; Gemma-4's alike), beside an
# `{layer_type}_original_inv_freq` copy; transformers 4's Gemma 3 computed its sliding layers' RoPE in a module of
# its own, `rotary_emb_local` (rope_local_base_freq, unscaled)
LAYER_BUFFER = re.compile(r"rotary_emb\.(?P<layer_type>[a-z][a-z_]{0,63})_inv_freq$")
LOCAL_BUFFER = ("rotary_emb_local.inv_freq", "sliding_attention")


def _wanted(name: str) -> tuple[str, str | None] | None:
    """(the kind of position tensor, its layer type or None for every layer), or None for any other tensor."""
    if name.endswith("rotary_emb.inv_freq"):
        return "inv_freq", None
    if name.endswith(LOCAL_BUFFER[0]):
        return "inv_freq", LOCAL_BUFFER[1]
    match = LAYER_BUFFER.search(name)
    if match is not None and not match["layer_type"].endswith("original"):  # the copy kept for dynamic RoPE
        return "inv_freq", match["layer_type"]
    if "alibi" in name and "slope" in name:
        return "alibi_slopes", None
    return None


def parse_header(c: Cursor) -> Layout:
    """The header, checked as the upload decoder checks it (`safetensors_header`: offsets within the data the file
    holds, consistent with dtype and shape, tiling it without holes or overlaps; every dtype code of the format),
    every shape within the audit's bound (`values.shape`); the ranges of the position tensors it names."""
    length = c.unpack("Q")
    if length > c.room():
        raise BadRequest(f"{c.what}: the safetensors header declares {length} bytes, more than the header may hold")
    counted = f"{c.what}: the safetensors header"
    header = safetensors_header.parse(c.take(length), c.what,
                                      count=lambda raw: values.count_json(raw, counted, HEADER_LIMITS))
    for name, entry in header.items():  # the bound every reader of the audit puts on a shape (rank, elements)
        if name != "__metadata__" and isinstance(entry, dict) and "shape" in entry:
            values.shape(f"{c.what}: tensor {name[:80]!r} has invalid offsets or shape: its shape", entry["shape"])
    base = 8 + length
    tensors, end = safetensors_header.entries(header, None if c.size is None else c.size - base, c.what,
                                              safetensors_header.FORMAT_BITS)
    layout = Layout({"tensors": {}, "count": {}}, extent=base + end,
                    check_size=lambda size: safetensors_header.covered(end, size - base, c.what))
    for name, entry in tensors.items():
        label = f"{c.what}: tensor {name[:80]!r}"
        if name.endswith(LEARNED):
            layout.header["tensors"].setdefault("learned", (name, entry.shape, entry.dtype))
        wanted = _wanted(name)
        if wanted is None:
            continue
        kind, layer_type = wanted
        key = kind if layer_type is None else f"{layer_type}/{kind}"
        layout.header["count"][key] = layout.header["count"].get(key, 0) + 1
        if key in layout.ranges or len(layout.ranges) > MAX_LAYER_TYPES:
            continue  # one buffer of each kind (and layer type) is read: every layer stores the same
        if entry.dtype not in DTYPES:
            raise BadRequest(f"{label} must be a float tensor ({', '.join(DTYPES)}), got dtype "
                             f"{values.shown(entry.dtype)}")
        values.shape(f"{label}: its shape", entry.shape, MAX_SMALL)  # read for its values
        values.position_shape(label, kind, entry.shape)
        layout.ranges[key] = (base + entry.begin, entry.end - entry.begin)
        layout.header["tensors"][key] = (name, entry.shape, entry.dtype)
    return layout


def to_found(header: dict[str, Any], tensors: dict[str, bytes]) -> Found:
    """The checkpoint's facts; a layer type's own buffers in `found.layers[layer_type]`."""
    found = Found("safetensors")
    described = header["tensors"]
    for key, raw in tensors.items():
        name, shape, dtype = described[key]
        layer_type, _, kind = key.rpartition("/")
        into = found.layers.setdefault(layer_type, Found("safetensors", layer_type=layer_type)) if layer_type \
            else found
        values = np.frombuffer(raw, dtype=DTYPES[dtype]).reshape(shape).astype(np.float32)
        setattr(into, kind, values.reshape(-1) if kind == "alibi_slopes" else values)
        if kind == "inv_freq":
            into.rotary_dim = 2 * values.shape[-1]
            found.notes.append(f"{name} (and {header['count'][key] - 1} more buffers like it)")
    if "learned" in described:
        name, shape, _ = described["learned"]
        found.learned_positions, found.learned_name = tuple(shape), name
        if len(shape) == 2:
            found.hidden_size = shape[1]
    if not tensors and "learned" not in described:
        found.notes.append("no position tensor (rotary_emb.inv_freq, wpe, embed_positions, ALiBi slopes) is "
                           "stored: the checkpoint's position handling is all in its config.json")
    return found
