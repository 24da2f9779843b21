"""config.json alone: what transformers builds from it (`posenc.models.rope_config`), and the warnings it
raises on the way (unknown rope_type, original length missing, the legacy `type` key). A JSON file audited is
that, or `posenc audit --remote`'s extract (`document_found`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc.models.architectures import rope_switched_off, with_family_spellings
from posenc.models.audit.found import Fact, Found
from posenc.models.audit.reference import SLIDING_LAYER_TYPE, model_sizes, text_section
from posenc.models.errors import ParameterError
from posenc.models.rope_config import rope_layer_types, rope_parameters_from_config
from posenc.models.rope_params import RopeParameters
from posenc.models.rope_types import ROPE_TYPES
from posenc.service.audit import extract, values
from posenc.service.audit_limits import MAX_LAYER_TYPES
from posenc.service.codec.safetensors_header import json_object
from posenc.service.errors import BadRequest

# A config.json is a few KB: a few hundred values, nested 3 or 4 deep; the largest hold a classifier's id2label
# and label2id (ImageNet-21k's: 2 x 21,843 entries). The bounds are well above any real one and keep a parse of
# a hostile one (60 MiB of `[{},{},...]`: 1.8 GB of dicts) within tens of MB. The extract is read the same way:
# its arrays are base64 strings, so it holds a few dozen values.
LIMITS = values.JsonLimits(values=100_000, depth=64)


def parse(body: bytes | str, what: str = "config.json") -> Mapping[str, Any]:
    """A JSON object, counted within LIMITS before it is parsed (`values.json_document`)."""
    return json_object(values.json_document(body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body,
                                            what, LIMITS), what)


def layer_types(config: Mapping[str, Any], what: str) -> tuple[str, ...]:
    """The layer types of `config` with a RoPE of their own (`rope_layer_types`: one pass over the config), at most
    MAX_LAYER_TYPES: a 400 naming the bound beyond, before any of them is resolved (each resolution reads the whole
    rope dict)."""
    names = rope_layer_types(config)
    if len(names) > MAX_LAYER_TYPES:
        raise BadRequest(f"{what}: rope_parameters gives {len(names)} layer types a RoPE of their own; the audit "
                         f"judges at most {MAX_LAYER_TYPES} (models have two or three: Gemma's full_attention and "
                         "sliding_attention)")
    return names


def document_found(body: bytes) -> Found:
    """The facts of a JSON file: `posenc audit --remote`'s extract (it holds `extract.MARK`), else a config.json."""
    document = parse(body, "JSON upload")
    if extract.MARK in document:
        return extract.load(document)
    return to_found(document)


def to_found(config: Mapping[str, Any]) -> Found:
    """A config.json's facts as transformers builds them; with RoPE per layer type (transformers 5's nested
    rope_parameters), each layer type's in `found.layers` and its main layers' (not sliding) at the top. Its sizes
    (hidden size, heads, KV heads, context) are read as the reference reads them, through the table of architectures
    (`reference.model_sizes`)."""
    cfg = text_section(config)
    sizes = model_sizes(config)
    found = Found("config.json", architecture=sizes.model_type)
    if _learned_positions(found, cfg):
        return found
    if rope_switched_off(with_family_spellings(cfg, sizes.model_type), sizes.model_type):
        found.rope_off = "its config switches RoPE off (a model without positions)"
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    names = layer_types(config, "config.json")
    if isinstance(rope, Mapping):
        for name, entry in ({name: rope[name] for name in names} if names else {"": rope}).items():
            if isinstance(entry, Mapping):
                _warnings(found, cfg, entry, name)
    try:
        resolved = {name: rope_parameters_from_config(config, layer_type=name) for name in names} or \
            {"": rope_parameters_from_config(config)}
    except ParameterError as exc:
        found.facts.append(Fact("rope", "a RoPE configuration transformers builds", None, "wrong",
                                "config_not_buildable", str(exc)))
        return found
    main = next((name for name in resolved if name != SLIDING_LAYER_TYPE), next(iter(resolved)))
    params, info = resolved[main]
    found.context_length = info.get("max_position_embeddings") or sizes.context_length
    found.hidden_size, found.num_heads, found.num_kv_heads = sizes.hidden_size, sizes.num_heads, sizes.num_kv_heads
    _rope_facts(found, params, info)
    for name in names:
        found.layers[name] = _rope_facts(Found("config.json", layer_type=name), *resolved[name])
    return found


# keys that give a config RoPE (transformers' spellings, old and new): a config with none of them and GPT-2's learned
# table size `n_positions` has no RoPE at all (GPT-J and CodeGen state n_positions beside rotary_dim)
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "rotary_dim", "rotary_pct", "rotary_emb_base",
             "partial_rotary_factor", "rotary_emb_fraction")


def _learned_positions(found: Found, cfg: Mapping[str, Any]) -> bool:
    """A config of learned absolute positions and no RoPE (GPT-2: `n_positions` rows of `wpe`): its table size and
    sizes as the file's facts, no RoPE to resolve. False for any other config."""
    rows = cfg.get("n_positions")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1 or any(key in cfg for key in ROPE_KEYS):
        return False
    width, heads = cfg.get("n_embd", cfg.get("hidden_size")), cfg.get("n_head", cfg.get("num_attention_heads"))
    found.context_length, found.learned_positions, found.learned_name = rows, (rows,), "n_positions"
    found.hidden_size = width if isinstance(width, int) and not isinstance(width, bool) else None
    found.num_heads = heads if isinstance(heads, int) and not isinstance(heads, bool) else None
    found.notes.append(f"no RoPE: the model learns a table of n_positions = {rows} absolute positions")
    return True


def _warnings(found: Found, cfg: Mapping[str, Any], rope: Mapping[str, Any], layer_type: str) -> None:
    """What transformers warns of, or reads otherwise than other loaders, in one RoPE dict (`layer_type`: its key in
    a per-layer-type rope_parameters, "" for the one dict)."""
    where = f"rope_parameters.{layer_type}" if layer_type else "rope_scaling"
    if "type" in rope and "rope_type" not in rope:
        found.facts.append(Fact(f"{where}.type", "rope_type", "type", "note", None,
                                "the legacy key `type` names the rope_type; transformers reads it, other "
                                "loaders may not: write rope_type"))
    kind = rope.get("rope_type", rope.get("type"))
    # a per-layer-type entry takes no top-level original_max_position_embeddings (standardize_rope_params)
    top_level = None if layer_type else cfg.get("original_max_position_embeddings")
    if isinstance(kind, str) and kind in ROPE_TYPES and ROPE_TYPES[kind].original_from_max \
            and "original_max_position_embeddings" not in rope and top_level is None:
        found.facts.append(Fact(f"{layer_type}.original_max_position_embeddings" if layer_type
                                else "original_max_position_embeddings", "given", None, "note", None,
                                f"{kind} reads original_max_position_embeddings; it is missing, so transformers "
                                "takes max_position_embeddings"))


def _rope_facts(found: Found, params: RopeParameters, info: Mapping[str, Any]) -> Found:
    found.head_dim, found.rotary_dim, found.rope_theta = params.head_dim, params.rotary_dim, params.rope_theta
    found.scaling = {"rope_type": params.rope_type}
    for name in ROPE_TYPES[params.rope_type].reads:
        if getattr(params, name) is not None:
            found.scaling[name] = getattr(params, name)
    if info.get("mrope_section"):
        found.sections = tuple(info["mrope_section"])
    return found
