"""Where each architecture's config.json states its text model's attention facts: one table, read by the RoPE
resolver (`posenc.models.rope_config`), the audit's references and the presets alike.

transformers' config classes name the same facts under many keys: the heads are `num_attention_heads`, `n_head`
(GPT-J, CodeGen), `n_heads` (DBRX) or `decoder_num_attention_heads` (Moonshine); the text model sits in the config
itself, in `text_config`, in `decoder_config` (Dia), in `thinker_config.text_config` (Qwen-Omni) or in `encoder` /
`decoder` (T5Gemma); and the head size a rotary module rotates is `head_dim` (times `partial_rotary_factor`), else
`qk_rope_head_dim` (the MLA models, whose config classes set head_dim to it), else a key of the family's own
(`kv_channels` for JetMoE, `attention_head_dim` for Zamba2), else hidden // heads. What differs per family is data
(`FAMILIES`); the rules that hold for every config are the generic key lists below. docs/ENCODINGS.md §1.1.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from posenc.models import hub_configs
from posenc.models.errors import ParameterError

PairLayout = Literal["half", "interleaved"]

# The generic spellings, tried after a family's own: the first key present with a positive integer wins. Other
# spellings are a family's (GPT-2's n_embd and n_head describe a model without RoPE).
HIDDEN_KEYS = ("hidden_size",)
HEADS_KEYS = ("num_attention_heads",)
KV_HEADS_KEYS = ("num_key_value_heads",)
CONTEXT_KEYS = ("max_position_embeddings", "n_positions")
HEAD_SIZE_KEYS = ("head_dim", "qk_rope_head_dim")
# Multi-head latent attention (DeepSeek-V2/V3, MiniCPM3, Kimi): a q/k head's unrotated and rotated channels and the
# KV latent's width (the audit expects llama.cpp's key_length / key_length_mla from them).
MLA_KEYS = ("qk_nope_head_dim", "qk_rope_head_dim", "kv_lora_rank")
# Sub-configs that hold a composite model's text model, tried in order when the config itself has no heads.
SECTIONS = ("text_config", "thinker_config.text_config", "decoder_config", "language_config", "llm_config",
            "encoder", "decoder")


@dataclass(frozen=True)
class Family:
    """What one architecture (a `model_type`) spells its own way.

    head_size: keys that give the rotated head size, tried before the generic `HEAD_SIZE_KEYS`.
    hidden, heads, kv_heads: the family's own spellings of the hidden size and the head counts.
    rope: False for families whose positions are not rotary (GPT-2's learned table, BLOOM's and MPT's ALiBi): their
        heads are read, a RoPE is not resolved.
    renamed: {config.json key: the name the resolver reads} (a config class's own renames; a given new name wins).
    rotary_dim: the config's `rotary_dim` is the rotated channels of each head (GPT-J, CodeGen).
    layout: how the model pairs channels when it rotates q and k: half (rotate_half, cat(f, f)) or interleaved
        (GPT-J pairs).
    mrope_section: the M-RoPE sections the rotary module takes when the config names none;
    mrope_order: how its sections share out the frequencies (`posenc.models.mrope.mrope_axis`): contiguous (Qwen2-VL),
        interleaved (T H W T H W ...: Qwen3-VL) or alternating_hw (ERNIE-4.5-VL).
    xdrope: the model's `mrope_section` is XD-RoPE's four sections (position, width, height, image index: HunyuanOCR),
        which span the rotated frequencies; text positions are the same on every axis.
    rope_switch: (the config key, the value) that turns the model's RoPE on; any other value (or none) leaves its
        attention without positions (NoPE: GraniteMoeHybrid's position_embedding_type). Its rotary module, built
        directly, still computes a table: the resolver serves it; the audit judges files against no RoPE.
    hub_form: the config class's rewrite of the hub's spelling into transformers 5's form (`posenc.models.
        hub_configs`), applied to the text model's section before anything reads it.
    """

    head_size: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    heads: tuple[str, ...] = ()
    kv_heads: tuple[str, ...] = ()
    renamed: Mapping[str, str] = field(default_factory=dict)
    rotary_dim: bool = False
    rope: bool = True
    layout: PairLayout = "half"
    mrope_section: tuple[int, int, int] | None = None
    mrope_order: Literal["contiguous", "interleaved", "alternating_hw"] = "contiguous"
    xdrope: bool = False
    rope_switch: tuple[str, str] | None = None
    hub_form: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None


_QWEN2_VL = Family(mrope_section=(16, 24, 24))
_QWEN3_VL = Family(mrope_section=(24, 20, 20), mrope_order="interleaved")
_QWEN3_5 = Family(mrope_section=(11, 11, 10), mrope_order="interleaved")
_GLM4_V = Family(mrope_section=(8, 12, 12))
_GPTJ_KEYS = {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_positions": "max_position_embeddings"}
_INTERLEAVED = Family(layout="interleaved")

# model_type → its family; a model_type not listed reads the generic keys with rotate_half pairs.
FAMILIES: dict[str, Family] = {
    "gpt_neox": Family(renamed={"rotary_emb_base": "rope_theta", "rotary_pct": "partial_rotary_factor"}),
    "gptj": Family(renamed=_GPTJ_KEYS, rotary_dim=True, layout="interleaved"),
    "codegen": Family(renamed=_GPTJ_KEYS, rotary_dim=True, layout="interleaved"),
    "jetmoe": Family(head_size=("kv_channels",)),
    "dbrx": Family(hidden=("d_model",), heads=("n_heads",)),
    # Falcon: transformers 5 saves `num_kv_heads` (the head count by default) beside `num_key_value_heads`, the KV
    # heads FalconAttention runs (1 where multi_query and not new_decoder_architecture): that one first; the hub's
    # configs have `num_kv_heads` alone (Falcon-40B's 8) or neither (Falcon-7B: multi-query, not stated)
    "falcon": Family(heads=("n_head",), kv_heads=("num_key_value_heads", "num_kv_heads")),
    "gpt2": Family(hidden=("n_embd",), heads=("n_head",), rope=False),
    "bloom": Family(hidden=("n_embed",), heads=("n_head",), rope=False),
    "mpt": Family(hidden=("d_model",), heads=("n_heads",), rope=False),
    # GLM-5-Next's text model: linear-attention layers and MLA layers without a rotated part (qk_rope_head_dim 0)
    "glm5_next": Family(rope=False),
    "moonshine": Family(heads=("decoder_num_attention_heads", "encoder_num_attention_heads"),
                        kv_heads=("decoder_num_key_value_heads", "encoder_num_key_value_heads")),
    "zamba2": Family(head_size=("attention_head_dim",)),
    # nomic-bert's published config.json (nomic-ai's remote code): GPT-2's size keys, the RoPE under rotary_emb_*
    "nomic_bert": Family(hidden=("n_embd",), heads=("n_head",),
                         renamed={"rotary_emb_base": "rope_theta", "rotary_emb_fraction": "partial_rotary_factor"}),
    # rotary modules that pair neighbouring channels (repeat_interleave, complex products, rotate_every_two)
    "cohere": _INTERLEAVED, "cohere2": _INTERLEAVED, "cohere2_moe": _INTERLEAVED,
    "ernie4_5": _INTERLEAVED, "ernie4_5_moe": _INTERLEAVED, "glm": _INTERLEAVED, "glm4": _INTERLEAVED,
    "llama4": _INTERLEAVED, "llama4_text": _INTERLEAVED,
    "deepseek_v2": _INTERLEAVED, "deepseek_v4": Family(layout="interleaved", hub_form=hub_configs.deepseek_v4),
    # Dots3-Note: the published config.json's swa_* keys and DSA layers named full_attention
    "dots3_note": Family(hub_form=hub_configs.dots3_note),
    # ModernBERT's global_rope_theta / local_rope_theta; MiMo-V2-Flash's hybrid_layer_pattern and swa_rope_theta
    "modernbert": Family(hub_form=hub_configs.modernbert),
    "mimo_v2_flash": Family(hub_form=hub_configs.mimo_v2_flash),
    # Step-3.5/3.7's per-layer rope_theta and partial_rotary_factors lists
    "step3p5": Family(hub_form=hub_configs.step3p5),
    # M-RoPE: the sections each family's rotary module defaults to, and their order
    "qwen2_vl": _QWEN2_VL, "qwen2_5_vl": _QWEN2_VL, "qwen2_5_omni": _QWEN2_VL, "paddleocr_vl": _QWEN2_VL,
    "qwen2_5_omni_talker": _QWEN2_VL, "qwen2_5_omni_thinker": _QWEN2_VL,
    "qwen3_vl": _QWEN3_VL, "qwen3_vl_moe": _QWEN3_VL, "qwen3_omni_moe": _QWEN3_VL, "cosmos3_edge": _QWEN3_VL,
    "qwen3_5": _QWEN3_5, "qwen3_5_moe": _QWEN3_5, "qwen4_exp": _QWEN3_5,
    "glm4v": Family(layout="interleaved", mrope_section=(8, 12, 12)), "glm4v_moe": _GLM4_V, "glm_image": _GLM4_V,
    "glm_ocr": Family(layout="interleaved", mrope_section=(8, 12, 12)),
    "ernie4_5_vl_moe": Family(layout="interleaved", mrope_section=(22, 22, 20), mrope_order="alternating_hw"),
    "hunyuan_vl": Family(xdrope=True),
    "granitemoehybrid": Family(rope_switch=("position_embedding_type", "rope")),
    "hy_v4_vl": Family(layout="interleaved", mrope_section=(24, 20, 20), mrope_order="interleaved"),
}


def family(model_type: str | None) -> Family:
    """The family of `model_type`: listed, or listed without a `_text` suffix (a composite's text model: `glm4v_text`
    is GLM-4V's), else the generic one."""
    name = model_type or ""
    return FAMILIES.get(name) or FAMILIES.get(name.removesuffix("_text")) or Family()


def rope_switched_off(section: Mapping[str, Any], model_type: str | None) -> bool:
    """Whether the family's switch (`Family.rope_switch`) leaves this config's model without RoPE."""
    switch = family(model_type).rope_switch
    return switch is not None and section.get(switch[0]) != switch[1]


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def first_int(config: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    """The first of `keys` that `config` gives as a positive integer."""
    return next((config[key] for key in keys if positive_int(config.get(key))), None)


def _at(config: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    node: Any = config
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else None


def hidden_keys(model_type: str | None) -> tuple[str, ...]:
    return family(model_type).hidden + HIDDEN_KEYS


def heads_keys(model_type: str | None) -> tuple[str, ...]:
    return family(model_type).heads + HEADS_KEYS


def kv_heads_keys(model_type: str | None) -> tuple[str, ...]:
    return family(model_type).kv_heads + KV_HEADS_KEYS


def _has_heads(config: Mapping[str, Any], wrapper: Mapping[str, Any]) -> bool:
    keys = (*heads_keys(model_type_of(wrapper, config)), *family(model_type_of(wrapper, config)).renamed, "head_dim")
    return any(key in config for key in keys)


def model_section(config: Mapping[str, Any], path: str | None = None) -> tuple[str, Mapping[str, Any]]:
    """(dotted path, mapping) of the text model a config.json describes: the config itself when it names heads or a
    head size, else the first sub-config of `SECTIONS` that does (a top-level `hidden_size` alone, as
    Voxtral-Realtime's, does not stop the search); the config itself when none does. `path` chooses another model
    of a composite config (`audio_config`, `talker_config.text_config`): ParameterError when it names no object."""
    if path:
        section = _at(config, path)
        if section is None:
            raise ParameterError("config_section", f"{path[:100]!r} names no object of the config")
        return path, _in_transformers_form(config, section)
    if _has_heads(config, config):
        return "", _in_transformers_form(config, config)
    for path in SECTIONS:
        section = _at(config, path)
        if section is not None and _has_heads(section, config):
            return path, _in_transformers_form(config, section)
    return "", _in_transformers_form(config, config)


def _in_transformers_form(config: Mapping[str, Any], section: Mapping[str, Any]) -> Mapping[str, Any]:
    """`section` as its family's config class reads it: the hub's spelling rewritten where the family has one."""
    rewrite = family(model_type_of(config, section)).hub_form
    return section if rewrite is None else rewrite(section)


def model_type_of(config: Mapping[str, Any], section: Mapping[str, Any]) -> str | None:
    """The text model's model_type (its own, else the wrapper's)."""
    value = section.get("model_type") or config.get("model_type")
    return str(value) if value else None


def with_family_spellings(section: Mapping[str, Any], model_type: str | None) -> Mapping[str, Any]:
    """`section` with its family's renamed keys also under the resolver's names (a given new name wins)."""
    renamed = family(model_type).renamed
    if not renamed:
        return section
    out = dict(section)
    for old, new in renamed.items():
        if old in section and section.get(new) is None:
            out[new] = section[old]
    return out


def head_size(section: Mapping[str, Any], model_type: str | None) -> int:
    """The head size the text model's rotary module starts from (before partial_rotary_factor): the family's keys,
    then `head_dim`, `qk_rope_head_dim`, then hidden // heads. ParameterError when the config gives none."""
    size = first_int(section, family(model_type).head_size + HEAD_SIZE_KEYS)
    if size is not None:
        return size
    hidden, heads = first_int(section, hidden_keys(model_type)), first_int(section, heads_keys(model_type))
    if hidden is not None and heads is not None:
        return hidden // heads
    raise ParameterError(
        "head_dim",
        "config.json has no head size: give head_dim (or qk_rope_head_dim), or hidden_size and num_attention_heads "
        "(positive integers)",
    )


# The keys a layer type's `per_layer_config` overrides can change the head size through (and, in a model with
# multi-head latent attention, its q/k head and KV latent: Dots3-Note's sliding layers have their own).
HEAD_SIZE_INPUTS = frozenset((*HEAD_SIZE_KEYS, *HIDDEN_KEYS, *HEADS_KEYS, *MLA_KEYS, "kv_channels",
                              "attention_head_dim"))
