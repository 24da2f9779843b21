"""GET /v1/rope and POST /v1/rope/from-config: RoPE cos/sin tables (ENCODINGS.md §1, §2).

Both resolve their input to `models.rope.RopeParameters` first (422 naming the parameter on bad
values), declare the output tensors from the resolved parameters (size check before computing) and
let `models.rope.rope_cos_sin` do the math. Parameter names follow transformers so a config can be
pasted.
"""

import json
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from models.dtypes import np_dtype
from models.rope import (
    Form,
    Layout,
    RopeParameters,
    RopeType,
    make_rope_parameters,
    rope_cos_sin,
    rope_parameters_from_config,
)
from models.rope_params import MAX_LENGTH, MAX_SCALE, MAX_THETA
from service.arrays import Bundle
from service.errors import BadRequest, InvalidParameter
from service.tables import FloatDTypeQuery, TableDep, TableRequest, TensorSpec
from service.uploads import read_body

router = APIRouter(tags=["tables"])

MAX_ROWS = 1 << 31
MAX_DIM = 1 << 16
MAX_OFFSET = 1 << 40
MAX_CONFIG_BYTES = 1 << 20  # a config.json is a few KiB; Phi-3's factor lists included

OffsetQuery = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Position of the first row.")]
LayoutQuery = Annotated[
    Layout,
    Query(description="Channel order of form=full: half = cat(freqs, freqs) as HF rotate_half (NeoX, Llama); "
                      "interleaved = each frequency twice in a row (GPT-J, Meta complex)."),
]
FormQuery = Annotated[
    Form,
    Query(description="full: [max_position, rotary_dim] ready for q*cos + rotate(q)*sin; half: "
                      "[max_position, rotary_dim/2], one column per frequency (onnx RotaryEmbedding, "
                      "flash-attention caches); layout does not apply."),
]


def _factor_list(name: str, text: str) -> tuple[float, ...] | None:
    """Parse a comma-separated list of numbers (longrope short/long factors); empty = not given."""
    if not text:
        return None
    try:
        return tuple(float(item) for item in text.split(","))
    except ValueError:
        raise InvalidParameter(f"{name}: must be comma-separated numbers (rotary_dim/2 of them)") from None


def _serve(table: TableRequest, endpoint: str, params: RopeParameters, request_params: dict[str, Any],
           max_position: int, offset: int, layout: Layout, form: Form, dtype: str,
           extra_metadata: dict[str, str] | None = None) -> Response:
    """Declare cos/sin/inv_freq from the resolved parameters and hand the computation to the table path."""
    width = params.table_dim if form == "full" else params.n_frequencies
    out_dtype = np_dtype(dtype)
    specs = {
        "cos": TensorSpec((max_position, width), out_dtype),
        "sin": TensorSpec((max_position, width), out_dtype),
        "inv_freq": TensorSpec((params.n_frequencies,), np_dtype("float32")),
    }
    # form=half has one column per frequency: the layout does not apply (and must not split the cache)
    canonical = {**params.as_metadata(), **request_params, "max_position": max_position, "offset": offset,
                 "layout": layout if form == "full" else None, "form": form, "dtype": dtype}

    def compute() -> Bundle:
        cos, sin, info = rope_cos_sin(params, max_position, offset, layout, form, out_dtype)
        metadata = {"attention_factor": repr(info.attention_factor), "seq_len": str(info.seq_len),
                    "table_dim": str(params.table_dim), **(extra_metadata or {})}
        if info.factor_set is not None:
            metadata["factor_set"] = info.factor_set
        if info.dynamic_rope_theta is not None:
            metadata["dynamic_rope_theta"] = repr(info.dynamic_rope_theta)
        return Bundle({"cos": cos, "sin": sin, "inv_freq": info.inv_freq}, metadata)

    return table.serve(endpoint=endpoint, params=canonical, specs=specs, compute=compute)


@router.get(
    "/v1/rope",
    summary="RoPE cos/sin table (every transformers rope_type)",
    response_description="Tensors `cos`, `sin` [max_position, rotary_dim] (form=half: rotary_dim/2 columns; "
                         "proportional: head_dim) in the requested dtype, and `inv_freq` [rotary_dim/2] float32.",
)
def rope(
    table: TableDep,
    max_position: Annotated[int, Query(ge=1, le=MAX_ROWS, description="Number of rows (positions).")],
    head_dim: Annotated[int, Query(ge=2, le=MAX_DIM, description="Attention head size.")],
    offset: OffsetQuery = 0,
    partial_rotary_factor: Annotated[
        float,
        Query(gt=0, le=1, description="Fraction of head_dim that is rotated: rotary_dim = int(head_dim * factor) "
                                      "(transformers truncation; an odd result is refused)."),
    ] = 1.0,
    rotary_dim: Annotated[
        int, Query(ge=0, le=MAX_DIM, description="Rotated channels (even, <= head_dim), instead of "
                                                 "partial_rotary_factor. 0: from partial_rotary_factor.")
    ] = 0,
    rope_theta: Annotated[float, Query(gt=1, le=MAX_THETA, description="RoPE base.")] = 10000.0,
    rope_type: Annotated[RopeType, Query(description="Scaling variant, as transformers' rope_type.")] = "default",
    factor: Annotated[
        float,
        Query(ge=0, le=MAX_SCALE,
              description="Scaling factor, >= 1. Required by linear, dynamic, llama3 and yarn (yarn and longrope "
                          "derive it as max / original from max_position_embeddings; proportional: 1). 0: not given."),
    ] = 0.0,
    original_max_position_embeddings: Annotated[
        int, Query(ge=0, le=MAX_LENGTH, description="Pre-training context length (yarn, longrope, llama3). "
                                                    "0: not given (then max_position_embeddings).")
    ] = 0,
    max_position_embeddings: Annotated[
        int, Query(ge=0, le=MAX_LENGTH, description="The model's context length: dynamic's original length "
                                                    "(required there), yarn/longrope's factor when factor is not "
                                                    "given. 0: not given.")
    ] = 0,
    attention_factor: Annotated[
        float, Query(ge=0, le=MAX_SCALE, description="yarn/longrope: scale of cos and sin. 0: derived from factor.")
    ] = 0.0,
    beta_fast: Annotated[
        float, Query(ge=0, le=MAX_SCALE, description="yarn: extrapolation boundary (0 means 32, as in transformers).")
    ] = 32.0,
    beta_slow: Annotated[
        float, Query(ge=0, le=MAX_SCALE, description="yarn: interpolation boundary (0 means 1, as in transformers).")
    ] = 1.0,
    mscale: Annotated[
        float, Query(ge=0, le=MAX_SCALE, description="yarn: attention-factor numerator scale; used when mscale and "
                                               "mscale_all_dim are both non-zero.")
    ] = 0.0,
    mscale_all_dim: Annotated[
        float, Query(ge=0, le=MAX_SCALE, description="yarn: attention-factor denominator scale.")
    ] = 0.0,
    truncate: Annotated[bool, Query(description="yarn: floor/ceil the correction range.")] = True,
    low_freq_factor: Annotated[
        float, Query(ge=0, le=MAX_SCALE, description="llama3: low-frequency factor (> 0, required). 0: not given.")
    ] = 0.0,
    high_freq_factor: Annotated[
        float, Query(ge=0, le=MAX_SCALE, description="llama3: high-frequency factor (> 0, != low_freq_factor, "
                                               "required). 0: not given.")
    ] = 0.0,
    short_factor: Annotated[
        str, Query(max_length=1 << 20, description="longrope: rotary_dim/2 comma-separated factors for short "
                                                   "contexts (required). Empty: not given.")
    ] = "",
    long_factor: Annotated[
        str, Query(max_length=1 << 20, description="longrope: rotary_dim/2 comma-separated factors beyond "
                                                   "original_max_position_embeddings (required). Empty: not given.")
    ] = "",
    layout: LayoutQuery = "half",
    form: FormQuery = "full",
    dtype: FloatDTypeQuery = "float32",
) -> Response:
    if rotary_dim and partial_rotary_factor != 1.0:
        raise InvalidParameter("rotary_dim: give either rotary_dim or partial_rotary_factor, not both")
    params = make_rope_parameters(
        head_dim=head_dim, rotary_dim=rotary_dim or None, partial_rotary_factor=None if rotary_dim else
        partial_rotary_factor, rope_theta=rope_theta, rope_type=rope_type, factor=factor or None,
        original_max_position_embeddings=original_max_position_embeddings or None,
        max_position_embeddings=max_position_embeddings or None, attention_factor=attention_factor or None,
        beta_fast=beta_fast, beta_slow=beta_slow, mscale=mscale, mscale_all_dim=mscale_all_dim,
        truncate=truncate, low_freq_factor=low_freq_factor or None, high_freq_factor=high_freq_factor or None,
        short_factor=_factor_list("short_factor", short_factor),
        long_factor=_factor_list("long_factor", long_factor),
    )
    return _serve(table, "rope", params, {}, max_position, offset, layout, form, dtype)


async def config_body(request: Request) -> dict[str, Any]:
    """The request body parsed as a JSON object (400 when it is not JSON, 413 when too large)."""
    limit = min(MAX_CONFIG_BYTES, request.app.state.settings.max_request_bytes)
    body = await read_body(request.headers.get("content-length"), request.stream(), limit)
    try:
        config = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the body must be a Hugging Face config.json (JSON object): {exc}") from None
    if not isinstance(config, dict):
        raise BadRequest(f"the body must be a JSON object (a config.json), got {type(config).__name__}")
    return config


CONFIG_BODY_SCHEMA = {
    "requestBody": {
        "required": True,
        "description": "A Hugging Face model config.json: v4 `rope_scaling` (with `type` or `rope_type`) or v5 "
                       "`rope_parameters` (flat, or per layer type with `layer_types`), `rope_theta`, `head_dim` or "
                       "`hidden_size`/`num_attention_heads` (DeepSeek: `qk_rope_head_dim`), "
                       "`partial_rotary_factor`, `max_position_embeddings`, top-level "
                       "`original_max_position_embeddings` (Phi-3). Multimodal configs: read from `text_config`.",
        "content": {"application/json": {"schema": {"type": "object", "additionalProperties": True}}},
    }
}


@router.post(
    "/v1/rope/from-config",
    summary="RoPE cos/sin table from a Hugging Face config.json",
    response_description="Same tensors as GET /v1/rope; metadata holds every resolved value.",
    openapi_extra=CONFIG_BODY_SCHEMA,
)
def rope_from_config(
    table: TableDep,
    config: Annotated[dict[str, Any], Depends(config_body)],
    max_position: Annotated[
        int, Query(ge=0, le=MAX_ROWS, description="Number of rows. 0: the config's max_position_embeddings.")
    ] = 0,
    offset: OffsetQuery = 0,
    layer_type: Annotated[
        str, Query(max_length=128, description="For per-layer rope_parameters (e.g. Gemma's full_attention / "
                                               "sliding_attention): which entry. Empty: the config's only one.")
    ] = "",
    layout: LayoutQuery = "half",
    form: FormQuery = "full",
    dtype: FloatDTypeQuery = "float32",
) -> Response:
    params, info = rope_parameters_from_config(config, layer_type=layer_type or None)
    rows = max_position or info["max_position_embeddings"]
    if rows is None:
        raise InvalidParameter("max_position: the config has no max_position_embeddings; give max_position")
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
        raise InvalidParameter(f"max_position: must be an integer in [1, {MAX_ROWS}], got {rows!r}")
    request_params = {"layer_type": layer_type or None,
                      "config_max_position_embeddings": info["max_position_embeddings"]}
    extra = {"rope_source": info["rope_source"], "config_section": info["config_section"] or "top-level"}
    return _serve(table, "rope/from-config", params, request_params, rows, offset, layout, form, dtype, extra)

