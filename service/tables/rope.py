"""RoPE cos/sin tables: `GET /v1/rope` (parameters in the query) and `POST /v1/rope/from-config`
(a Hugging Face config.json). docs/ENCODINGS.md §1, §2.

Both resolve to `posenc.models.rope.RopeParameters` first (422 naming the parameter), declare cos/sin/
inv_freq from the resolved parameters (size check before computing) and let `posenc.models.rope` do the
math. Parameter names follow transformers so a config can be pasted; which rope_types read each
scaling parameter comes from the rope_type registry.
"""

import json
from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

from pydantic import Field

from posenc.models.bounds import DEFAULT_ROPE_THETA, MAX_CONTEXT, MAX_DIM, MAX_OFFSET, MAX_ROWS, MAX_SCALE, MAX_THETA
from posenc.models.dtypes import np_dtype
from posenc.models.errors import ParameterError
from posenc.models.rope import (
    Form,
    Layout,
    RopeParameters,
    make_rope_parameters,
    rope_cos_sin,
    rope_parameters_from_config,
)
from posenc.models.rope_types import (
    DEFAULT_ROPE_TYPE,
    ROPE_TYPES,
    YARN_BETA_FAST_DEFAULT,
    YARN_BETA_SLOW_DEFAULT,
    TransformersRopeType,
    YarnMscale,
    resolve_variant,
    with_query_defaults,
)
from posenc.service.codec.encode import Bundle
from posenc.service.errors import BadRequest, InvalidParameter
from posenc.service.tables.fields import FloatDTypeField
from posenc.service.tables.registry import FLOAT64_TEMPORARY, Body, TableQuery, TensorSpec, register_table

LAYOUT_DOC = ("Channel order of form=full: half = cat(freqs, freqs) as HF rotate_half (NeoX, Llama); "
              "interleaved = each frequency twice in a row (GPT-J, Meta complex).")
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KiB; Phi-3's factor lists included
MAX_FACTOR_LIST = 1 << 20  # characters of a comma-separated longrope factor list
_NUMBER = r"\s*[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?\s*"
# the OpenAPI pattern of a factor list (the server parses it with float(), which accepts these and a few more)
FACTOR_LIST: dict[str, Any] = {"pattern": f"^{_NUMBER}(,{_NUMBER})*$"}


def _read_by(field: str) -> str:
    """`(read by yarn, longrope)`: the rope_types whose formula reads `field`, from the registry."""
    return "(read by " + ", ".join(name for name, spec in ROPE_TYPES.items() if field in spec.reads) + ")"


def _factor_rules() -> str:
    """Which rope_types require a factor, derive it or default it, from the registry."""
    required = [name for name, spec in ROPE_TYPES.items() if "factor" in spec.required and not spec.factor_from_lengths]
    derived = [name for name, spec in ROPE_TYPES.items() if spec.factor_from_lengths]
    defaulted = [f"{name}: {spec.default_factor:g}" for name, spec in ROPE_TYPES.items()
                 if spec.default_factor is not None]
    return (f"Required by {', '.join(required)} ({' and '.join(derived)} derive it as max / original from "
            f"max_position_embeddings; {', '.join(defaulted)}). ")


def _factor_list(name: str, text: str | None) -> tuple[float, ...] | None:
    """Parse a comma-separated list of numbers (longrope short/long factors)."""
    if text is None:
        return None
    try:
        return tuple(float(item) for item in text.split(","))
    except ValueError:
        raise InvalidParameter(f"{name}: must be comma-separated numbers (rotary_dim/2 of them)") from None


class RopeTableQuery(TableQuery):
    """Rows, layout and dtype of a RoPE table: what both RoPE routes ask besides the RoPE itself."""

    tensors = ("cos", "sin", "inv_freq")
    row_tensors: ClassVar[tuple[str, ...]] = ("cos", "sin")

    offset: int = Field(0, ge=0, le=MAX_OFFSET, description="Position of the first row.")
    form: Form = Field("full", description=(
        "full: [max_position, rotary_dim] ready for q*cos + rotate(q)*sin; half: [max_position, rotary_dim/2], "
        "one column per frequency (onnx RotaryEmbedding, flash-attention caches); layout does not apply."))
    dtype: FloatDTypeField = "float32"

    @property
    def rope(self) -> RopeParameters:
        raise NotImplementedError

    @property
    def pair_layout(self) -> Layout:
        """The channel order of form=full the table is written in."""
        raise NotImplementedError

    @property
    def rows(self) -> int:
        raise NotImplementedError

    def check(self) -> None:
        self.rope  # noqa: B018 - resolving the parameters is the check

    def params(self) -> dict[str, Any]:
        # form=half has one column per frequency: the layout does not apply (and must not split the cache)
        return {**self.rope.as_metadata(), "max_position": self.rows, "offset": self.offset,
                "layout": self.pair_layout if self.form == "full" else None, "form": self.form, "dtype": self.dtype}

    def specs(self) -> dict[str, TensorSpec]:
        width = self.rope.table_dim if self.form == "full" else self.rope.n_frequencies
        out_dtype = np_dtype(self.dtype)
        return {"cos": TensorSpec((self.rows, width), out_dtype), "sin": TensorSpec((self.rows, width), out_dtype),
                "inv_freq": TensorSpec((self.rope.n_frequencies,), np_dtype("float32"))}

    def working_bytes(self, specs: Mapping[str, TensorSpec]) -> int:
        # angles, cos and sin in float64 over [rows, rotary_dim/2]: 1.5 float64 values per full-form element
        cos = specs["cos"]
        return super().working_bytes(specs) + 3 * FLOAT64_TEMPORARY * cos.shape[0] * self.rope.n_frequencies

    def metadata(self) -> dict[str, str]:
        """Metadata beyond the parameters."""
        return {}

    def compute_rows(self, rows: slice | None) -> Bundle:
        cos, sin, info = rope_cos_sin(self.rope, self.rows, self.offset, self.pair_layout, self.form,
                                      np_dtype(self.dtype), rows)
        metadata = {"attention_factor": repr(info.attention_factor), "seq_len": str(info.seq_len),
                    "table_dim": str(self.rope.table_dim), **self.metadata()}
        if info.factor_set is not None:
            metadata["factor_set"] = info.factor_set
        if info.dynamic_rope_theta is not None:
            metadata["dynamic_rope_theta"] = repr(info.dynamic_rope_theta)
        return Bundle({"cos": cos, "sin": sin, "inv_freq": info.inv_freq}, metadata)


class RopeQuery(RopeTableQuery):
    """cos/sin for positions offset .. offset + max_position − 1 under any transformers rope_type; they
    include the attention factor (as transformers' cos/sin do). For dynamic and longrope the table is
    what transformers computes for a batch whose largest position is the last row.
    """

    endpoint = "rope"
    preset_table = "rope"

    max_position: int = Field(ge=1, le=MAX_ROWS, description="Number of rows (positions).")
    layout: Layout = Field("half", description=LAYOUT_DOC)
    head_dim: int = Field(ge=2, le=MAX_DIM, description="Attention head size.")
    partial_rotary_factor: float | None = Field(None, gt=0, le=1, description=(
        "Fraction of head_dim that is rotated: rotary_dim = int(head_dim * factor) (transformers truncation; "
        "an odd result is refused). Not given: 1.0, or rotary_dim."))
    rotary_dim: int | None = Field(None, ge=2, le=MAX_DIM, json_schema_extra={"multipleOf": 2}, description=(
        "Rotated channels (even, <= head_dim), instead of partial_rotary_factor."))
    rope_theta: float = Field(DEFAULT_ROPE_THETA, gt=1, le=MAX_THETA, description="RoPE base.")
    rope_type: TransformersRopeType = Field(DEFAULT_ROPE_TYPE, description=(
        "Scaling variant, as transformers' rope_type (dynamic with alpha: NTK-alpha; yarn with yarn_mscale=deepseek: "
        "vLLM's DeepSeek-YaRN)."))
    factor: float | None = Field(None, gt=0, le=MAX_SCALE, description=(
        "Scaling factor, >= 1. " + _factor_rules() + _read_by("factor")))
    original_max_position_embeddings: int | None = Field(None, ge=1, le=MAX_CONTEXT, description=(
        "Pre-training context length; not given: max_position_embeddings. "
        + _read_by("original_max_position_embeddings")))
    max_position_embeddings: int | None = Field(None, ge=1, le=MAX_CONTEXT, description=(
        "The model's context length: dynamic's original length (required there), yarn/longrope's factor when "
        "factor is not given. " + _read_by("max_position_embeddings")))
    attention_factor: float | None = Field(None, ge=0, le=MAX_SCALE, description=(
        "Scale of cos and sin; not given: derived from factor. deepseek_yarn: vLLM's attn_factor, multiplying "
        "the mscale ratio (default 1). " + _read_by("attention_factor")))
    beta_fast: float = Field(YARN_BETA_FAST_DEFAULT, ge=0, le=MAX_SCALE, description=(
        f"Extrapolation boundary (0 means {YARN_BETA_FAST_DEFAULT:g}, as in transformers). " + _read_by("beta_fast")))
    beta_slow: float = Field(YARN_BETA_SLOW_DEFAULT, ge=0, le=MAX_SCALE, description=(
        f"Interpolation boundary (0 means {YARN_BETA_SLOW_DEFAULT:g}, as in transformers). " + _read_by("beta_slow")))
    mscale: float | None = Field(None, ge=0, le=MAX_SCALE, description=(
        "Attention-factor numerator scale. yarn: used when mscale and mscale_all_dim are both non-zero (not "
        "given: 0); deepseek_yarn: always (not given: 1, as vLLM). " + _read_by("mscale")))
    mscale_all_dim: float = Field(0.0, ge=0, le=MAX_SCALE, description=(
        "Attention-factor denominator scale. " + _read_by("mscale_all_dim")))
    truncate: bool = Field(True, description="Floor/ceil the correction range. " + _read_by("truncate"))
    low_freq_factor: float | None = Field(None, gt=0, le=MAX_SCALE, description=(
        "Low-frequency factor (required). " + _read_by("low_freq_factor")))
    high_freq_factor: float | None = Field(None, gt=0, le=MAX_SCALE, description=(
        "High-frequency factor (!= low_freq_factor, required). " + _read_by("high_freq_factor")))
    short_factor: str | None = Field(None, max_length=MAX_FACTOR_LIST, json_schema_extra=FACTOR_LIST, description=(
        "rotary_dim/2 comma-separated factors for short contexts (required). " + _read_by("short_factor")))
    long_factor: str | None = Field(None, max_length=MAX_FACTOR_LIST, json_schema_extra=FACTOR_LIST, description=(
        "rotary_dim/2 comma-separated factors beyond original_max_position_embeddings (required). "
        + _read_by("long_factor")))
    alpha: float | None = Field(None, ge=1, le=MAX_SCALE, description=(
        "dynamic only: a fixed NTK alpha, base theta · alpha^(d/(d−2)) (rope_type ntk_alpha: vLLM "
        "DynamicNTKAlphaRotaryEmbedding, HunYuan); factor and max_position_embeddings are then not read."))
    yarn_mscale: YarnMscale = Field("transformers", description=(
        "yarn only: transformers' attention factor, or deepseek (rope_type deepseek_yarn: vLLM "
        "DeepseekScalingRotaryEmbedding: always mscale(s, mscale) / mscale(s, mscale_all_dim) · attention_factor, "
        "mscale default 1)."))

    @property
    def rows(self) -> int:
        return self.max_position

    @property
    def pair_layout(self) -> Layout:
        return self.layout

    @cached_property
    def rope(self) -> RopeParameters:
        values = self.model_dump(exclude={"max_position", "offset", "layout", "form", "dtype", "yarn_mscale"})
        values["rope_type"] = resolve_variant(self.rope_type, alpha=self.alpha, yarn_mscale=self.yarn_mscale)
        values = with_query_defaults(values)  # one spelling of a table keeps one cache key
        values["short_factor"] = _factor_list("short_factor", self.short_factor)
        values["long_factor"] = _factor_list("long_factor", self.long_factor)
        return make_rope_parameters(**values)


def decode_config(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The request body parsed as a JSON object (400 when it is not JSON, or nested beyond reason)."""
    try:
        config = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the body must be a Hugging Face config.json (JSON object): {exc}") from None
    except RecursionError:
        raise BadRequest("the body must be a Hugging Face config.json: it is nested too deeply") from None
    if not isinstance(config, dict):
        raise BadRequest(f"the body must be a JSON object (a config.json), got {type(config).__name__}")
    return config


CONFIG_BODY = Body(decode=decode_config, limit=MAX_CONFIG_BYTES, openapi={
    "requestBody": {
        "required": True,
        "description": "A Hugging Face model config.json: v4 `rope_scaling` (with `type` or `rope_type`) or v5 "
                       "`rope_parameters` (flat, or per layer type with `layer_types`), `rope_theta`, `head_dim` or "
                       "`hidden_size`/`num_attention_heads` (DeepSeek: `qk_rope_head_dim`), "
                       "`partial_rotary_factor`, `max_position_embeddings`, top-level "
                       "`original_max_position_embeddings` (Phi-3). Multimodal configs: read from `text_config`; "
                       "Qwen2-VL/2.5-VL/3-VL (`mrope_section`): the table for text positions, sections in the "
                       "metadata (POST /v1/rope/mrope for image/video positions).",
        "content": {"application/json": {"schema": {"type": "object", "additionalProperties": True}}},
    }
})


class RopeFromConfigQuery(RopeTableQuery):
    """The RoPE a config.json describes, resolved exactly as transformers 5.23 resolves it; the metadata
    holds every resolved value.
    """

    endpoint = "rope/from-config"
    body = CONFIG_BODY

    max_position: int | None = Field(None, ge=1, le=MAX_ROWS, description=(
        "Number of rows. Not given: the config's max_position_embeddings."))
    layer_type: str | None = Field(None, max_length=128, description=(
        "For per-layer rope_parameters (e.g. Gemma's full_attention / sliding_attention): which entry. "
        "Not given: the config's only one."))
    config_section: str | None = Field(None, max_length=256, pattern=r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$", description=(
        "The dotted path of the model whose RoPE to answer in a composite config (audio_config, "
        "talker_config.text_config). Not given: the text model (the config itself, text_config, "
        "thinker_config.text_config, decoder_config, ...)."))
    layout: Layout | None = Field(None, description=LAYOUT_DOC + (
        " Not given: the one the model's rotary module uses (interleaved for GPT-J, CodeGen, Cohere, GLM, ERNIE-4.5, "
        "Llama 4 and DeepSeek-V2/V4; half for the others), as the metadata's `layout` says."))

    @cached_property
    def resolved(self) -> tuple[RopeParameters, dict[str, Any]]:
        if self.upload is None:
            raise ParameterError("config", "a config.json body is required")
        return rope_parameters_from_config(self.upload, layer_type=self.layer_type, section=self.config_section)

    @property
    def rope(self) -> RopeParameters:
        return self.resolved[0]

    @property
    def pair_layout(self) -> Layout:
        layout: Layout = self.layout or self.resolved[1]["layout"]
        return layout

    @property
    def rows(self) -> int:
        rows = self.max_position or self.resolved[1]["max_position_embeddings"]
        if rows is None:
            raise InvalidParameter("max_position: the config has no max_position_embeddings; give max_position")
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
            raise InvalidParameter(f"max_position: must be an integer in [1, {MAX_ROWS}], got {rows!r}")
        return rows

    def check(self) -> None:
        if self.upload is not None:  # before the body is read there is nothing to resolve yet
            super().check()

    def params(self) -> dict[str, Any]:
        info = self.resolved[1]
        # M-RoPE configs (Qwen2-VL family): the table is the text-position one; the sections are stated
        return {**super().params(), "layer_type": self.layer_type,
                "config_max_position_embeddings": info["max_position_embeddings"],
                "mrope_section": info.get("mrope_section"), "mrope_interleaved": info.get("mrope_interleaved"),
                "mrope_order": info.get("mrope_order")}

    def metadata(self) -> dict[str, str]:
        info = self.resolved[1]
        return {"rope_source": info["rope_source"], "config_section": info["config_section"] or "top-level"}


register_table("/v1/rope", RopeQuery, summary="RoPE cos/sin table (every transformers rope_type)",
               response_description="Tensors `cos`, `sin` [max_position, rotary_dim] (form=half: rotary_dim/2 "
                                    "columns; proportional: head_dim) in the requested dtype, and `inv_freq` "
                                    "[rotary_dim/2] float32.")
# /v1/rope/from-config is registered by posenc.service.tables.from_config (which adds the vision configs)
