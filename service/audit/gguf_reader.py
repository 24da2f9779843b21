"""GGUF (llama.cpp) headers, read within bounds: the metadata keys of position handling and the small tensors
`rope_freqs`, `rope_factors_long`, `rope_factors_short`; nothing else of the file is read.

The format's types, sizes and key names are ggml's `gguf` package's (the `audit` extra). Its GGUFReader maps
the whole file and walks every declared count, so the header is parsed here instead, each count checked
against its bound and the bytes the header may still take before anything is allocated or looped over. The
header declares no length: a parse over the bytes at hand that runs out asks for everything up to the header
limit (`NeedMore`), so a streamed header is parsed at most twice, the first time over its first 64 KiB.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import struct
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from posenc.models.audit.found import Found
from posenc.models.audit.llama_cpp import (
    ABSENT,
    ALPHA_AT_LOAD,
    COMPRESSED_LAYERS,
    FREQS_OF_FULL_LAYERS_ONLY,
    HALVED_FULL_ROTARY,
    MASK,
    MLA_HEAD,
    ROPE_SWITCH,
    ROPE_SWITCH_KEY,
    SWA_KEYS,
    UNIFORM_SCALE_ONE,
    UNIFORM_SCALING_SPELLING,
    UNROTATED_FACTOR,
    UNSCALED_SLIDING_LAYERS,
    WHOLE_HEAD_TYPE,
    YARN_MULTIPLIER,
    YARN_MULTIPLIER_KEY,
    convention,
)
from posenc.models.audit.reference import SLIDING_LAYER_TYPE
from posenc.models.bounds import DEFAULT_ROPE_THETA
from posenc.models.rope_types import GGUF_SCALING_TYPES, ROPE_TYPES
from posenc.service.audit import values
from posenc.service.audit.stream import Cursor, Layout, NeedMore
from posenc.service.errors import BadRequest

# Bounds far above any real file, checked before the entries are walked, so that the header's parse stays within
# about a second of CPU: real files hold a few dozen metadata entries (llama.cpp's converters write 20 to 60)
# and a few hundred to a few thousand tensors (experts are merged into one tensor per layer: DeepSeek-V3's
# 671B has 1,025, Llama 3.1 405B 1,138); the strings of metadata arrays are the vocabulary and the merges
# (Gemma 3: 262,144 tokens; Llama 3: 128,256 tokens and 280,147 merges).
MAX_KV = 1 << 12
MAX_TENSORS = 1 << 16
MAX_DIMS = 8
MAX_STRINGS = 1 << 21  # strings of metadata arrays in one header, kept or walked past
KEPT_ARRAY = 64  # arrays longer than this (the vocabulary) are skipped, not kept
NEEDED = {"rope_freqs": "freq_factors", "rope_factors_long": "long_factors", "rope_factors_short": "short_factors"}
# a learned absolute position table (GPT-2's wpe, written by the converter as position_embd [embedding, positions]):
# llama.cpp adds its rows to the token embeddings; such a model has no RoPE (`_learned_positions`)
LEARNED = "position_embd"
MAX_NEEDED_ELEMENTS = 1 << 16


@functools.cache
def _gguf() -> Any:
    """The `gguf` package's constants (value types, quantization sizes, alignment): the one module of it the header
    parse reads. It is loaded alone where it can be, since the package's `__init__` also imports its reader,
    writer, vocabulary and metadata (yaml among them), most of an audit's start-up; the whole package otherwise."""
    if (loaded := sys.modules.get("gguf.constants")) is not None:
        return loaded
    spec = importlib.util.find_spec("gguf")
    if spec is None or not spec.submodule_search_locations:  # the audit extra
        raise BadRequest("reading GGUF files needs the gguf package: pip install 'posenc[audit]'")
    location = Path(next(iter(spec.submodule_search_locations))) / "constants.py"
    alone = importlib.util.spec_from_file_location("posenc_gguf_constants", location)
    if alone is not None and alone.loader is not None:
        module = importlib.util.module_from_spec(alone)
        try:
            alone.loader.exec_module(module)
            return module
        except ImportError:  # a version whose constants need the rest of the package
            pass
    import gguf

    return gguf


def _scalar_formats(gguf: Any) -> dict[int, str]:
    t = gguf.GGUFValueType
    return {t.UINT8: "B", t.INT8: "b", t.UINT16: "H", t.INT16: "h", t.UINT32: "I", t.INT32: "i", t.FLOAT32: "f",
            t.BOOL: "?", t.UINT64: "Q", t.INT64: "q", t.FLOAT64: "d"}


def _string(c: Cursor, what: str = "string") -> str:
    length = c.unpack("Q")
    if length > c.room():
        raise BadRequest(f"{c.what}: a {what} declares {length} bytes, more than the header may hold")
    return c.take(length).decode("utf-8", "replace")


def _count_strings(c: Cursor, count: int) -> None:
    """`count` more strings of metadata arrays; at most MAX_STRINGS in one header."""
    c.items += count
    if c.items > MAX_STRINGS:
        raise BadRequest(f"{c.what}: more than {MAX_STRINGS} strings in metadata arrays")


_U64 = struct.Struct("<Q")


def _skip_strings(c: Cursor, count: int) -> None:
    """Walk past `count` strings (a vocabulary) without keeping them: one length read per string."""
    unpack, pos, left = _U64.unpack_from, c.pos, count
    while left:
        data = c.data
        try:
            while left:
                pos += 8 + unpack(data, pos)[0]
                left -= 1
        except struct.error:  # the next length lies past the bytes at hand: read on (or NeedMore, or a 413)
            c.reach(pos + 8)
    c.reach(pos)
    c.pos = pos


def _value(c: Cursor, kind: int, formats: dict[int, str], gguf: Any) -> Any:
    if kind in formats:
        return c.unpack(formats[kind])
    if kind == gguf.GGUFValueType.STRING:
        return _string(c)
    if kind != gguf.GGUFValueType.ARRAY:
        raise BadRequest(f"{c.what}: unknown metadata value type {kind}")
    item, count = c.unpack("I"), c.unpack("Q")
    if item == gguf.GGUFValueType.ARRAY:
        raise BadRequest(f"{c.what}: nested metadata arrays are not GGUF")
    size = 8 if item == gguf.GGUFValueType.STRING else np.dtype("<" + formats.get(item, "B")).itemsize
    if item not in formats and item != gguf.GGUFValueType.STRING:
        raise BadRequest(f"{c.what}: unknown metadata array type {item}")
    if count * size > c.room():
        raise BadRequest(f"{c.what}: a metadata array declares {count} entries, more than the header may hold")
    if item == gguf.GGUFValueType.STRING:
        _count_strings(c, count)
        if count <= KEPT_ARRAY:
            return [_string(c) for _ in range(count)]
        _skip_strings(c, count)
        return None
    if count > KEPT_ARRAY:
        c.skip(count * size)
        return None
    return np.frombuffer(c.take(count * size), dtype="<" + formats[item]).tolist()


def parse_header(c: Cursor) -> Layout:
    """The GGUF header: metadata, tensor infos, the byte ranges of the tensors position handling needs. A header
    that runs past the bytes at hand asks for all of them up to the limit (it declares no length)."""
    try:
        return _parse_header(c, _gguf())
    except NeedMore:
        raise NeedMore(c.limit) from None


def _parse_header(c: Cursor, gguf: Any) -> Layout:
    if c.take(4) != b"GGUF":
        raise BadRequest(f"{c.what}: not a GGUF file (no GGUF magic)")
    version = c.unpack("I")
    if version not in (2, 3):
        raise BadRequest(f"{c.what}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = c.unpack("Q"), c.unpack("Q")
    if n_kv > MAX_KV or n_tensors > MAX_TENSORS:
        raise BadRequest(f"{c.what}: declares {n_kv} metadata entries and {n_tensors} tensors; at most {MAX_KV} "
                         f"and {MAX_TENSORS} are read")
    formats = _scalar_formats(gguf)
    meta: dict[str, Any] = {}
    for _ in range(n_kv):
        key = _string(c, "metadata key")
        meta[key] = _value(c, c.unpack("I"), formats, gguf)
    infos = []
    for _ in range(n_tensors):
        name = _string(c, "tensor name")
        dims = c.unpack("I")
        if dims > MAX_DIMS:
            raise BadRequest(f"{c.what}: tensor {name[:80]!r} declares {dims} dimensions")
        shape = values.shape(f"{c.what}: tensor {name[:80]!r}", [c.unpack("Q") for _ in range(dims)])
        kind, offset = c.unpack("I"), c.unpack("Q")
        infos.append((name, shape, kind, offset))
    alignment = meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1 or alignment > 1 << 20:
        raise BadRequest(f"{c.what}: general.alignment {alignment!r} is not a usable alignment")
    start = -(-c.pos // alignment) * alignment
    layout = Layout({"meta": meta, "shapes": {}})
    sizes = {int(kind): size for kind, size in gguf.GGML_QUANT_SIZES.items()}
    for name, shape, kind, offset in infos:
        if kind not in sizes:
            raise BadRequest(f"{c.what}: tensor {name[:80]!r} has unknown type {kind}")
        block, type_size = sizes[kind]
        elements = math.prod(shape)
        nbytes = elements // block * type_size
        layout.extent = max(layout.extent, start + offset + nbytes)
        stem = name.removesuffix(".weight")
        if stem == LEARNED:
            layout.header["shapes"][stem] = shape  # its shape alone: the table's rows
        if stem in NEEDED:
            if kind != gguf.GGMLQuantizationType.F32 or elements > MAX_NEEDED_ELEMENTS:
                raise BadRequest(f"{c.what}: tensor {name} must be F32 with at most {MAX_NEEDED_ELEMENTS} values")
            layout.ranges[stem] = (start + offset, nbytes)
            layout.header["shapes"][stem] = shape
    return layout


def _first(value: Any) -> Any:
    """A per-layer array's first non-zero entry (head counts may be per layer), a scalar as is."""
    if isinstance(value, list):
        return next((v for v in value if v), None)
    return value


def _number(meta: dict[str, Any], key: str) -> Any:
    value = _first(meta.get(key))
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


# the keys (after `{arch}.`) that hold counts and sizes; the other numbers read are reals
INT_KEYS = frozenset({"context_length", "embedding_length", "attention.head_count", "attention.head_count_kv",
                      "attention.key_length", "attention.key_length_swa", "attention.key_length_mla",
                      "attention.key_length_mla_swa",
                      "rope.dimension_count", "rope.dimension_count_swa", "rope.scaling.original_context_length"})


def to_found(header: dict[str, Any], tensors: dict[str, bytes]) -> Found:
    """A parsed GGUF header and its small tensors → Found, with llama.cpp's conventions applied
    (`posenc.models.audit.llama_cpp`: its defaults for absent keys, the `rope_freqs` mask, the sliding layers'
    keys), each one quoted in the notes."""
    meta = header["meta"]
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise BadRequest("GGUF: general.architecture is missing; it names every other key")

    def key(suffix: str) -> Any:
        name = f"{arch}.{suffix}"
        if suffix in INT_KEYS:  # 0: not stated, as llama.cpp reads it
            return values.integer(f"GGUF: {name[:120]}", _number(meta, name), minimum=0)
        return values.number(f"GGUF: {name[:120]}", _number(meta, name))

    heads, hidden = key("attention.head_count"), key("embedding_length")
    head_dim = key("attention.key_length") or (hidden // heads if hidden and heads else None)
    found = Found("gguf", architecture=arch, context_length=key("context_length"), hidden_size=hidden,
                  num_heads=heads, num_kv_heads=key("attention.head_count_kv"), head_dim=head_dim,
                  key_length_mla=key("attention.key_length_mla") or None,
                  rotary_dim=key("rope.dimension_count") or head_dim, rope_theta=key("rope.freq_base"),
                  theta_swa=key("rope.freq_base_swa"), attention_factor=key("rope.scaling.attn_factor"))
    if _learned_positions(found, header, arch):
        return found
    if found.key_length_mla is not None:
        found.notes.append(MLA_HEAD.note(arch, absent=False))
    if found.rope_theta is None:
        _note_absent(found, arch, "rope.freq_base")
    _alpha_at_load(found, arch, key("rope.scaling.alpha"))
    _sliding_layers(found, arch, key)
    kind = meta.get(f"{arch}.rope.scaling.type")
    if isinstance(kind, str):
        if kind not in GGUF_SCALING_TYPES:
            found.notes.append(f"rope.scaling.type {kind[:40]!r} is not one llama.cpp knows")
        else:
            found.scaling["rope_type"] = GGUF_SCALING_TYPES[kind]
    # rope.scale_linear is the old name of rope.scaling.factor: llama.cpp reads it as the factor itself
    # (rope_freq_scale = 1 / value, llama-model.cpp) and its converters write add_rope_scale_linear(factor)
    factor = key("rope.scaling.factor") or key("rope.scale_linear") or None
    for name, value in (("factor", factor), ("original_max_position_embeddings",
                                             key("rope.scaling.original_context_length")),
                        ("beta_fast", key("rope.scaling.yarn_beta_fast")),
                        ("beta_slow", key("rope.scaling.yarn_beta_slow"))):
        if value is not None:
            found.scaling[name] = value
    if kind is None and factor is not None and factor != 1.0:  # a factor without a type: llama.cpp's default type
        default = convention(arch, "rope.scaling.type")
        if default is not None and isinstance(default.value, str):
            found.scaling = {"rope_type": GGUF_SCALING_TYPES[default.value], "factor": factor}
            found.notes.append(default.note(arch))
    if kind == UNIFORM_SCALING_SPELLING and factor in (None, 1.0):  # BitNet's and CodeShell's converters write it
        found.scaling = {}
        found.notes.append(f"{arch}.rope.scaling.type {kind!r} with factor {factor or 1:g}: {UNIFORM_SCALE_ONE}")
    _yarn_multiplier(found, arch, key(YARN_MULTIPLIER_KEY))
    factor_tensors = any(stem in tensors for stem in NEEDED)
    if found.scaling and "rope_type" not in found.scaling and not factor_tensors:
        found.scaling = {}  # scaling values without a type or factor tensors: llama.cpp applies none
    sections = meta.get(f"{arch}.rope.dimension_sections")
    if isinstance(sections, list):
        found.sections = values.integers(f"GGUF: {arch}.rope.dimension_sections", sections)
    switch = meta.get(f"{arch}.{ROPE_SWITCH_KEY}")
    if arch in ROPE_SWITCH and switch is False:
        found.rope_off = f"{arch}.{ROPE_SWITCH_KEY} = false: llama.cpp applies no RoPE ({ROPE_SWITCH[arch]})"
        found.notes.append(found.rope_off)
    elif switch is not None:
        found.notes.append(f"{ROPE_SWITCH_KEY} = {switch}")
    for stem, field_name in NEEDED.items():
        if stem in tensors:
            setattr(found, field_name, np.frombuffer(tensors[stem], dtype="<f4").copy())
    _sliding_view(found, arch, key)
    _halved_full_rotary(found, arch)
    _compressed_view(found, arch, key, meta)
    _unrotated_pairs(found)
    return found


def _alpha_at_load(found: Found, arch: str, alpha: float | None) -> None:
    """The base an architecture's loader stretches by rope.scaling.alpha (`llama_cpp.ALPHA_AT_LOAD`)."""
    source = ALPHA_AT_LOAD.get(arch)
    if source is None or alpha is None or not alpha > 0 or not found.head_dim or found.head_dim < 3:
        return  # the loader stretches only by a positive alpha
    written = found.rope_theta or DEFAULT_ROPE_THETA
    with np.errstate(all="ignore"):  # a hostile alpha overflows to an infinite base, which the tables show
        stretch = np.power(np.float64(alpha), found.head_dim / (found.head_dim - 2))
        found.rope_theta = float(np.float32(written) * np.float32(stretch))
    found.notes.append(f"{arch}.rope.scaling.alpha = {alpha:g}: llama.cpp runs base {found.rope_theta:g}, "
                       f"rope.freq_base {written:g} stretched ({source})")


def _halved_full_rotary(found: Found, arch: str) -> None:
    """The full layers of an architecture whose loader halves their rotated channels (`llama_cpp.HALVED_FULL_ROTARY`):
    half of the file's rotary dim, and the first half of its frequency factors."""
    source = HALVED_FULL_ROTARY.get(arch)
    if source is None or not found.rotary_dim:
        return
    found.rotary_dim //= 2
    if found.freq_factors is not None and found.freq_factors.shape[0] > found.rotary_dim // 2:
        found.freq_factors = found.freq_factors[: found.rotary_dim // 2]
    found.notes.append(f"{arch}: llama.cpp rotates {found.rotary_dim} channels of the full layers, half of "
                       f"rope.dimension_count ({source})")


def _compressed_view(found: Found, arch: str, key: Any, meta: dict[str, Any]) -> None:
    """The two RoPEs of an architecture whose compressed layers have their own (`llama_cpp.COMPRESSED_LAYERS`):
    `found.layers` under transformers' names of them, the file's scaling on the compressed layers alone (the whole
    file's facts are its main layers')."""
    rule = COMPRESSED_LAYERS.get(arch)
    if rule is None:
        return
    ratios = meta.get(f"{arch}.{rule.ratios}")
    ratios = values.integers(f"GGUF: {arch}.{rule.ratios}", ratios) if isinstance(ratios, list) else []
    base = key(rule.base)
    scaling = dict(found.scaling)
    if scaling.get("rope_type") is not None and "attention_factor" in ROPE_TYPES[scaling["rope_type"]].reads:
        scaling["attention_factor"] = 1.0
    found.scaling = {}
    found.layers[rule.main] = replace(found, facts=[], notes=[], layers={}, layer_type=rule.main)
    found.layers[rule.compressed] = replace(found, rope_theta=base, scaling=scaling, facts=[], notes=[], layers={},
                                            layer_type=rule.compressed)
    found.notes.append(rule.note(arch, list(ratios), base))


def _yarn_multiplier(found: Found, arch: str, stored: float | None) -> None:
    """rope.scaling.yarn_log_multiplier as `arch`'s loader reads it (`llama_cpp.YARN_MULTIPLIER`): YaRN's mscale and
    mscale_all_dim, whose ratio is the factor llama.cpp's cos and sin carry (absent or 0: 0.1 ln(s) + 1, transformers'
    yarn without them). A multiplier the loader does not read is noted and left out."""
    if not stored:
        return
    rule = YARN_MULTIPLIER.get(arch)
    if rule is None:
        found.notes.append(f"{arch}.{YARN_MULTIPLIER_KEY} = {stored:g}: llama.cpp's {arch} loader does not read it")
        return
    kind = found.scaling.get("rope_type")
    if kind is None or "mscale_all_dim" not in ROPE_TYPES[kind].reads:
        return  # read, but used only by a scaling that has YaRN's attention factor
    found.scaling["mscale"], found.scaling["mscale_all_dim"] = rule.mscales(stored)
    found.notes.append(f"{arch}.{YARN_MULTIPLIER_KEY} = {stored:g}: llama.cpp reads mscale "
                       f"{found.scaling['mscale']:g}, mscale_all_dim {found.scaling['mscale_all_dim']:g} "
                       f"({rule.source})")


def _learned_positions(found: Found, header: dict[str, Any], arch: str) -> bool:
    """A file with a learned position table and no RoPE key (GPT-2, StarCoder): the table's rows as its position
    fact, no RoPE stated (llama.cpp's defaults for the absent keys would describe a RoPE the model does not run).
    False for any other file."""
    shape = header["shapes"].get(LEARNED)
    meta = header["meta"]
    if shape is None or len(shape) != 2 or any(name.startswith(f"{arch}.rope.") for name in meta):
        return False
    found.learned_positions, found.learned_name = (shape[1], shape[0]), f"{LEARNED}.weight"
    found.rotary_dim = None
    found.notes.append(f"no RoPE: {LEARNED}.weight holds {shape[1]} learned absolute positions of {shape[0]} values")
    return True


def _note_absent(found: Found, arch: str, name: str, takes: float | None = None) -> None:
    rule = convention(arch, name)
    if rule is not None:
        found.notes.append(rule.note(arch, takes=takes))


def _sliding_layers(found: Found, arch: str, key: Any) -> None:
    """The sliding-window layers' keys: those the file states in one note; an absent one as llama.cpp fills it (its
    architecture's own base, else the full layers' value), said where the file has sliding layers at all."""
    stated = {name: key(name) for name in SWA_KEYS}
    stated = {name: value for name, value in stated.items() if value}
    if stated:
        found.notes.append("sliding layers: " + ", ".join(f"{arch}.{name} = {value:g}"
                                                          for name, value in stated.items()))
    base = convention(arch, "rope.freq_base_swa")
    if _own_sliding_rope(arch) and base is not None and isinstance(base.value, float) and found.theta_swa is None:
        found.theta_swa = base.value  # what llama.cpp's loader uses for this architecture's sliding layers
        found.notes.append(base.note(arch))
        stated["rope.freq_base_swa"] = base.value
    if not stated:
        return
    full = {"attention.key_length": found.head_dim, "rope.dimension_count": found.rotary_dim,
            "rope.freq_base": found.rope_theta or ABSENT["rope.freq_base"].value,
            "attention.key_length_mla": found.key_length_mla}
    for name in SWA_KEYS:
        rule = convention(arch, name)
        if name not in stated and rule is not None and rule.same_as is not None:
            value = full.get(rule.same_as)
            if value is None:
                continue  # nothing to inherit (a sliding MLA head where the file has no MLA)
            found.notes.append(rule.note(arch, takes=value if isinstance(value, int | float) else None))


def _own_sliding_rope(arch: str) -> bool:
    """Whether llama.cpp gives `arch`'s sliding layers a RoPE of their own: a base of their own when freq_base_swa is
    absent (not freq_base's), and no scaling (`llama_cpp.BY_ARCHITECTURE`)."""
    base = convention(arch, "rope.freq_base_swa")
    return base is not None and base.same_as is None and base.value is not None


def _sliding_view(found: Found, arch: str, key: Any) -> None:
    """The sliding-window layers' facts as llama.cpp's loader takes them, where the file has such layers (a `_swa`
    key stated, or an architecture whose sliding layers have a RoPE of their own): `found.layers["sliding_attention"]`.
    A `_swa` key absent takes the full layers' value (listed in `inherited`); an architecture whose sliding layers
    have a RoPE of their own leaves them unscaled, one whose graph gives `rope_freqs` to the full layers alone gives
    them no divisors (`llama_cpp`)."""
    stated = {name: key(name) or None for name in SWA_KEYS}
    fixed = _own_sliding_rope(arch)
    unscaled = UNSCALED_SLIDING_LAYERS.get(arch)
    windowed = unscaled is not None and bool(key("attention.sliding_window"))
    if not any(stated.values()) and not fixed and not windowed:
        return
    if unscaled is not None and windowed:
        found.notes.append(unscaled.note(arch))
    theta_swa = found.theta_swa if unscaled is None or unscaled.reads_swa_base else None
    sizes = {"head_dim": stated["attention.key_length_swa"], "rotary_dim": stated["rope.dimension_count_swa"],
             "key_length_mla": stated["attention.key_length_mla_swa"]}
    inherited = tuple(name for name, value in sizes.items()
                      if value is None and (name != "key_length_mla" or found.key_length_mla is not None))
    without_factors = arch in FREQS_OF_FULL_LAYERS_ONLY
    found.layers[SLIDING_LAYER_TYPE] = replace(
        found, head_dim=sizes["head_dim"] or found.head_dim, rotary_dim=sizes["rotary_dim"] or found.rotary_dim,
        key_length_mla=sizes["key_length_mla"] or found.key_length_mla,
        rope_theta=found.rope_theta if theta_swa is None else theta_swa, theta_swa=None,
        scaling={} if fixed or windowed else dict(found.scaling), facts=[], notes=[], layers={},
        layer_type=SLIDING_LAYER_TYPE,
        # a base the sliding layers take from freq_base by their loader's design is no key missing
        inherited=inherited + (("rope_theta",) if theta_swa is None and (unscaled is None or unscaled.reads_swa_base)
                               else ()),
        freq_factors=None if without_factors else found.freq_factors)


def _unrotated_pairs(found: Found) -> None:
    """llama.cpp's partial rotary as a mask: `rope_freqs` factors from UNROTATED_FACTOR up leave their pairs
    unrotated. The last pairs masked, the others 1 and dimension_count = head_dim (Gemma-4's converter) is RoPE
    over the whole head rotating 2 x the unmasked pairs: read so. Otherwise the divisors compute the table, as
    llama.cpp does, and the note says how many channels rotate."""
    factors = found.freq_factors
    if factors is None or factors.ndim != 1 or not factors.size:
        return
    masked = factors >= UNROTATED_FACTOR
    count, pairs = int(masked.sum()), int(factors.size)
    if not count:
        return
    kept = pairs - count
    note = (f"rope_freqs marks {count} of {pairs} pairs unrotated (factors >= {UNROTATED_FACTOR:g}): llama.cpp "
            f"rotates {2 * kept} channels of each head ({MASK.source})")
    whole_head = (bool(masked[kept:].all()) and kept > 0 and bool(np.all(factors[:kept] == 1.0))
                  and found.head_dim is not None and found.rotary_dim == found.head_dim == 2 * pairs
                  and "rope_type" not in found.scaling)
    if whole_head:
        found.notes.append(f"{note}; read as rotary_dim {2 * kept} of head_dim {found.head_dim}, the frequencies "
                           f"spread over the whole head ({WHOLE_HEAD_TYPE})")
        found.rotary_dim = 2 * kept
        found.scaling = {"rope_type": WHOLE_HEAD_TYPE}
        found.freq_factors = None  # the mask is the rotary dimension now: no divisors left
    else:
        found.notes.append(f"{note}; not the last pairs of a head of dimension_count = head_dim with the others 1: "
                           f"the table is computed from the divisors (rotary_dim {found.rotary_dim})")
