"""The rope_type registry: one entry per rope_type, holding every rule in which the types differ.

Each `RopeTypeSpec` holds the fields the type's formula reads, the fields the API requires, the keys
transformers' `_validate_<type>_rope_parameters` requires in a config.json, how wide its table is,
whether it scales the default frequencies, whether the table depends on the run-time sequence
length, its consistency checks, and its inverse-frequency and attention-factor functions
(`posenc.models.rope_frequencies`). Everything that knows RoPE reads it: validation
(`posenc.models.rope_params`), the config.json resolver (`posenc.models.rope_config`), the table math
(`posenc.models.rope`, `posenc.models.mrope`), the check's hypotheses (`posenc.models.diagnosis.rope`),
the exporter (flags and frozen inv_freq) and the
service's query model (the `rope_type` choices of the API and OpenAPI are `TransformersRopeType`).
Nothing outside this module names a rope_type: adding one is an entry here, its formula in
`posenc.models.rope_frequencies` and its tests.

Reference: transformers 5.23.0 `modeling_rope_utils.py` (`ROPE_INIT_FUNCTIONS`, the
`_validate_*_rope_parameters` functions, `RotaryEmbeddingConfigMixin`); docs/ENCODINGS.md §1.2, §14.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from posenc.models.errors import ParameterError
from posenc.models.rope_frequencies import (
    F32,
    YARN_BETA_FAST_DEFAULT,
    YARN_BETA_SLOW_DEFAULT,
    deepseek_yarn_attention_factor,
    default_inv_freq,
    dynamic_inv_freq,
    dynamic_rope_theta,
    linear_inv_freq,
    llama3_inv_freq,
    longrope_attention_factor,
    longrope_factor_set,
    longrope_inv_freq,
    ntk_alpha_inv_freq,
    plain_inv_freq,
    proportional_inv_freq,
    unit_attention_factor,
    yarn_attention_factor,
    yarn_inv_freq,
)

if TYPE_CHECKING:
    from posenc.models.rope_params import RopeParameters

__all__ = [
    "CONFIG_ALIASES",
    "DEFAULT_ROPE_TYPE",
    "F32",
    "GGUF_FREQ_FACTOR_TYPES",
    "GGUF_SCALING_TYPES",
    "LLAMA_3_1_ROPE",
    "ROPE_TYPES",
    "RUNTIME_DEPENDENT_TYPES",
    "SCALING_FIELDS",
    "YARN_BETA_FAST_DEFAULT",
    "YARN_BETA_SLOW_DEFAULT",
    "RopeType",
    "RopeTypeSpec",
    "TransformersRopeType",
    "YarnMscale",
    "api_spelling",
    "default_inv_freq",
    "resolve_variant",
    "rope_type_spec",
    "with_query_defaults",
]

YarnMscale = Literal["transformers", "deepseek"]


def _no_check(p: RopeParameters) -> None:
    """A type whose resolved fields need no check beyond each field's own."""


def _check_ntk_exponent(p: RopeParameters) -> None:
    """NTK-scaled bases raise theta to d / (d − 2): d = 2 divides by zero."""
    if p.rotary_dim <= 2:
        raise ParameterError("rotary_dim", f"{p.rope_type} RoPE needs rotary_dim > 2 (exponent d / (d - 2))")


def _check_llama3_smoothing(p: RopeParameters) -> None:
    """llama3's smoothing divides by high_freq_factor − low_freq_factor. Equal (Llama 4's 1 and 1), transformers warns
    and builds the frequencies all the same: each one kept or divided by factor, the band between them empty. Only a
    frequency whose float32 wavelength is exactly original / low_freq_factor falls in that band, where transformers
    computes zero over zero (NaN): refused."""
    if p.low_freq_factor == p.high_freq_factor and not np.all(np.isfinite(llama3_inv_freq(p, None))):
        raise ParameterError("high_freq_factor", f"equals low_freq_factor ({p.low_freq_factor!r}) and a frequency's "
                                                 "wavelength is exactly original_max_position_embeddings / "
                                                 "low_freq_factor: the smoothing divides zero by zero there "
                                                 "(transformers computes NaN)")


def _no_batch_info(p: RopeParameters, seq_len: int) -> Mapping[str, Any]:
    return {}


def _dynamic_batch_info(p: RopeParameters, seq_len: int) -> Mapping[str, Any]:
    return {"dynamic_rope_theta": dynamic_rope_theta(p, seq_len)}


def _longrope_batch_info(p: RopeParameters, seq_len: int) -> Mapping[str, Any]:
    return {"factor_set": longrope_factor_set(p, seq_len)}


def _longrope_switch_length(p: RopeParameters) -> int:
    return int(p.original_max_position_embeddings or 0)


@dataclass(frozen=True, kw_only=True)  # entries name every field: no counting positions
class RopeTypeSpec:
    """What one rope_type is.

    reads: `RopeParameters` fields its formula reads besides head_dim / rotary_dim / rope_theta /
        partial_rotary_factor (parameters it does not read are dropped, so equal tables resolve equally;
        a config.json's rope dict is read for exactly these);
    required: fields the API requires, in the order a missing-fields message names them;
    config_keys: keys transformers requires in a config.json's rope dict (a KeyError there);
    inv_freq, attention_factor: its formulas (`posenc.models.rope_frequencies`);
    factor_from_lengths: a missing factor is max_position_embeddings / original (yarn, longrope);
    default_factor: the factor when none is given and none is derived (None: required);
    runtime_dependent: inv_freq depends on the batch's sequence length (transformers recomputes it);
    switch_length: for a runtime-dependent type whose inv_freq takes one of two values, the seq_len up to
        which the first holds (longrope: original_max_position_embeddings; past it, the long factors);
        None: no such single switch (dynamic rescales at every length past max_position_embeddings);
    scaled: it rescales the default frequencies, so a port may have skipped or doubled the scaling;
    whole_head: the frequencies span the whole head (Gemma's proportional): the exponent divides by
        head_dim, rotary_dim = 2·int(partial_rotary_factor·head_dim // 2) may be 0, head_dim must be even
        and the table is head_dim wide, zero frequencies past rotary_dim;
    engine_variant: not a transformers rope_type; configs and the API spell it as another type plus a
        parameter (`resolve_variant`), so it is not one of the API's rope_type choices;
    check: consistency rules between resolved fields (ParameterError), after each field's own checks;
    batch_info: `posenc.models.rope.RopeInfo` fields the table of a batch of seq_len was computed with;
    query_defaults: values GET /v1/rope gives a field left out where the formula treats the two alike
        (one spelling of a table, one cache key);
    missing_hint: appended to the missing-fields message.
    """

    reads: frozenset[str]
    required: tuple[str, ...]
    config_keys: frozenset[str]
    inv_freq: Callable[[RopeParameters, int | None], np.ndarray]
    attention_factor: Callable[[RopeParameters], float] = unit_attention_factor
    factor_from_lengths: bool = False
    default_factor: float | None = None
    runtime_dependent: bool = False
    switch_length: Callable[[RopeParameters], int] | None = None
    scaled: bool = False
    whole_head: bool = False
    engine_variant: bool = False
    check: Callable[[RopeParameters], None] = _no_check
    batch_info: Callable[[RopeParameters, int], Mapping[str, Any]] = _no_batch_info
    query_defaults: Mapping[str, Any] = field(default_factory=dict)
    missing_hint: str = ""

    @property
    def original_from_max(self) -> bool:
        """original_max_position_embeddings defaults to max_position_embeddings (standardize_rope_params)."""
        return "original_max_position_embeddings" in self.reads

    @property
    def min_rotary_dim(self) -> int:
        """Fewest rotated channels: a whole-head type may rotate none (all frequencies zero)."""
        return 0 if self.whole_head else 2

    def rotated_channels(self, head_dim: int, partial_rotary_factor: float) -> int:
        """rotary_dim from partial_rotary_factor, with transformers' truncation: int(head_dim · factor);
        whole-head types: 2·rope_angles, rope_angles = int(factor · head_dim // 2) (float floor-division)."""
        if self.whole_head:
            return 2 * int(partial_rotary_factor * head_dim // 2)
        return int(head_dim * partial_rotary_factor)

    def table_width(self, head_dim: int, rotary_dim: int) -> int:
        """Channels of a full-form cos/sin row: the (even) head_dim for whole-head types, else rotary_dim."""
        return 2 * (head_dim // 2) if self.whole_head else rotary_dim


_DERIVED_HINT = "; with max_position_embeddings, original defaults to it and factor to max / original"
_ORIGINAL_HINT = "; original_max_position_embeddings defaults to max_position_embeddings"

DEFAULT_ROPE_TYPE = "default"  # the rope_type of a config or a request that names none: unscaled RoPE

ROPE_TYPES: dict[str, RopeTypeSpec] = {
    DEFAULT_ROPE_TYPE: RopeTypeSpec(
        reads=frozenset(),
        required=(),
        config_keys=frozenset({"rope_type"}),
        inv_freq=plain_inv_freq,
    ),
    "linear": RopeTypeSpec(
        reads=frozenset({"factor"}),
        required=("factor",),
        config_keys=frozenset({"rope_type", "factor"}),
        inv_freq=linear_inv_freq,
        scaled=True,
    ),
    "dynamic": RopeTypeSpec(
        reads=frozenset({"factor", "max_position_embeddings"}),
        required=("factor", "max_position_embeddings"),
        config_keys=frozenset({"rope_type", "factor"}),
        inv_freq=dynamic_inv_freq,
        runtime_dependent=True,
        scaled=True,
        check=_check_ntk_exponent,
        batch_info=_dynamic_batch_info,
    ),
    "yarn": RopeTypeSpec(
        reads=frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                   "mscale", "mscale_all_dim", "truncate"}),
        required=("factor", "original_max_position_embeddings"),
        config_keys=frozenset({"rope_type", "factor", "original_max_position_embeddings"}),
        inv_freq=yarn_inv_freq,
        attention_factor=yarn_attention_factor,
        factor_from_lengths=True,
        scaled=True,
        query_defaults=MappingProxyType({"mscale": 0.0}),
        missing_hint=_DERIVED_HINT,
    ),
    "longrope": RopeTypeSpec(
        reads=frozenset({"factor", "original_max_position_embeddings", "attention_factor", "short_factor",
                         "long_factor"}),
        required=("short_factor", "long_factor", "original_max_position_embeddings", "factor"),
        config_keys=frozenset({"rope_type", "short_factor", "long_factor", "original_max_position_embeddings"}),
        inv_freq=longrope_inv_freq,
        attention_factor=longrope_attention_factor,
        factor_from_lengths=True,
        runtime_dependent=True,
        switch_length=_longrope_switch_length,
        scaled=True,
        batch_info=_longrope_batch_info,
        missing_hint=_DERIVED_HINT,
    ),
    "llama3": RopeTypeSpec(
        reads=frozenset({"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}),
        required=("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
        config_keys=frozenset({"rope_type", "factor", "original_max_position_embeddings", "low_freq_factor",
                               "high_freq_factor", "rope_theta"}),
        inv_freq=llama3_inv_freq,
        scaled=True,
        check=_check_llama3_smoothing,
        missing_hint=_ORIGINAL_HINT,
    ),
    "proportional": RopeTypeSpec(
        reads=frozenset({"factor"}),
        required=(),
        config_keys=frozenset({"rope_type", "rope_theta"}),
        inv_freq=proportional_inv_freq,
        default_factor=1.0,
        whole_head=True,
    ),
    # Inference-engine variants (not transformers rope_types): formulas from vLLM, docs/ENCODINGS.md §14
    "ntk_alpha": RopeTypeSpec(
        reads=frozenset({"alpha"}),
        required=("alpha",),
        config_keys=frozenset({"rope_type", "alpha"}),
        inv_freq=ntk_alpha_inv_freq,
        engine_variant=True,
        check=_check_ntk_exponent,
    ),
    "deepseek_yarn": RopeTypeSpec(
        reads=frozenset({"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                   "mscale", "mscale_all_dim"}),
        required=("factor", "original_max_position_embeddings"),
        config_keys=frozenset({"rope_type", "factor", "original_max_position_embeddings"}),
        inv_freq=yarn_inv_freq,
        attention_factor=deepseek_yarn_attention_factor,
        engine_variant=True,
        missing_hint=_ORIGINAL_HINT,
    ),
}

# config.json spellings that name a registry entry: Qwen2VLConfig / Qwen2_5_VLConfig rename `mrope` to the
# default when they load (`mrope_section` is M-RoPE's own, models.mrope)
CONFIG_ALIASES: Mapping[str, str] = MappingProxyType({"mrope": DEFAULT_ROPE_TYPE})

# GGUF files (llama.cpp's converters): `{arch}.rope.scaling.type` values → registry entry; llama3's frequency
# factors travel as the `rope_freqs` tensor instead (inverse-frequency divisors), longrope's as the
# `rope_factors_long` / `rope_factors_short` tensors (with or without the type)
GGUF_SCALING_TYPES: Mapping[str, str] = MappingProxyType({"none": DEFAULT_ROPE_TYPE, "linear": "linear", "yarn": "yarn",
                                                          "longrope": "longrope"})
GGUF_FREQ_FACTOR_TYPES: frozenset[str] = frozenset({"llama3"})

# The API's and the type checker's names for the registry's keys: pydantic and OpenAPI see the Literal of
# the keys (engine variants excluded from the API's choices); mypy sees str, as the keys are data.
if TYPE_CHECKING:
    RopeType = str
    TransformersRopeType = str
else:
    RopeType = Literal[tuple(ROPE_TYPES)]
    TransformersRopeType = Literal[tuple(name for name, spec in ROPE_TYPES.items() if not spec.engine_variant)]

RUNTIME_DEPENDENT_TYPES: tuple[str, ...] = tuple(name for name, spec in ROPE_TYPES.items() if spec.runtime_dependent)
# Every field some rope_type reads beyond the geometry: the scaling parameters of the API and the exporter.
SCALING_FIELDS: frozenset[str] = frozenset().union(*(spec.reads for spec in ROPE_TYPES.values()))

# Llama-3.1's RoPE (config.json `rope_theta` and `rope_scaling`): the shipped llama3_1_attention graph's.
LLAMA_3_1_ROPE: Mapping[str, Any] = MappingProxyType({
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
})


def resolve_variant(rope_type: str, *, alpha: Any = None, yarn_mscale: str | None = None) -> str:
    """The registry entry a config's or the API's rope_type names: a config alias (`CONFIG_ALIASES`);
    `dynamic` with a truthy `alpha` is NTK-alpha (HunYuan checkpoints, vLLM `get_rope`); `yarn` with
    yarn_mscale="deepseek" is vLLM's deepseek_yarn."""
    rope_type = CONFIG_ALIASES.get(rope_type, rope_type)
    if rope_type == "dynamic" and alpha:
        return "ntk_alpha"
    if rope_type == "yarn" and yarn_mscale == "deepseek":
        return "deepseek_yarn"
    return rope_type


def api_spelling(rope_type: str) -> tuple[str, dict[str, Any]]:
    """How the API spells a registry entry: (rope_type, the parameter that selects the variant), the inverse of
    `resolve_variant` (ntk_alpha: dynamic with its alpha, read from the parameters; deepseek_yarn: yarn with
    yarn_mscale=deepseek)."""
    if rope_type == "ntk_alpha":
        return "dynamic", {}
    if rope_type == "deepseek_yarn":
        return "yarn", {"yarn_mscale": "deepseek"}
    return rope_type, {}


def rope_type_spec(rope_type: str) -> RopeTypeSpec:
    """The registry entry, or a ParameterError listing the known rope_types."""
    spec = ROPE_TYPES.get(rope_type)
    if spec is None:
        raise ParameterError("rope_type", f"unknown rope_type {rope_type!r}; known: {', '.join(ROPE_TYPES)}")
    return spec


def with_query_defaults(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` (with a known `rope_type`) with the type's `query_defaults` for the fields left out (None)."""
    defaults = rope_type_spec(values["rope_type"]).query_defaults
    return {**values, **{name: value for name, value in defaults.items() if values.get(name) is None}}
