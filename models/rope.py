"""Rotary position embedding (RoPE) tables: inverse frequencies, attention factor, cos/sin.

Reference: huggingface/transformers 5.23.0 `src/transformers/modeling_rope_utils.py`
(`ROPE_INIT_FUNCTIONS`, `dynamic_rope_update`) and `models/llama/modeling_llama.py`
(`LlamaRotaryEmbedding`); semantics in docs/ENCODINGS.md §1 and §2.

Precision contract (docs/ENCODINGS.md): `inv_freq` is computed in float32 as transformers computes
it (`posenc.models.rope_types`, one function per rope_type); angles, cos and sin are then evaluated in
float64 from that float32 vector, multiplied by the attention factor and cast once.

Numpy only: no torch, no HTTP.
"""

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from posenc.models.architectures import PairLayout
from posenc.models.dtypes import cast, np_dtype
from posenc.models.errors import ParameterError
from posenc.models.rope_config import rope_parameters_from_config
from posenc.models.rope_frequencies import F32, yarn_correction_range
from posenc.models.rope_params import RopeParameters, make_rope_parameters
from posenc.models.rope_types import ROPE_TYPES, RopeType, rope_type_spec
from posenc.models.row_blocks import table_rows

__all__ = [
    "ROPE_TYPES",
    "Form",
    "Layout",
    "RopeInfo",
    "RopeParameters",
    "RopeType",
    "inv_freq_and_attention_factor",
    "inv_freq_switch",
    "make_rope_parameters",
    "rope_cos_sin",
    "rope_parameters_from_config",
    "yarn_correction_range",
]

Layout = PairLayout  # one spelling of the channel pairings: posenc.models.architectures
Form = Literal["full", "half"]


@dataclass(frozen=True)
class RopeInfo:
    """What a table was computed with, beyond the parameters.

    inv_freq: float32 [n_frequencies]; attention_factor: folded into cos and sin;
    seq_len: largest position + 1 (the batch length transformers' forward would see);
    factor_set: "short" / "long" for longrope, else None;
    dynamic_rope_theta: the rescaled base of dynamic NTK (float32 value), else None.
    """

    inv_freq: np.ndarray
    attention_factor: float
    seq_len: int
    factor_set: Literal["short", "long"] | None = None
    dynamic_rope_theta: float | None = None


def inv_freq_and_attention_factor(
    params: RopeParameters, seq_len: int | None = None
) -> tuple[np.ndarray, float]:
    """Inverse frequencies (float32 [rotary_dim/2]; proportional [head_dim/2]) and attention factor.

    `seq_len` is the largest position + 1 of the batch; it matters for `dynamic` (rescaled base
    beyond max_position_embeddings) and `longrope` (long factors beyond the original length), as in
    transformers' `dynamic_rope_update`. None = at init time (no batch seen yet).
    """
    spec = rope_type_spec(params.rope_type)
    return spec.inv_freq(params, seq_len).astype(F32), float(spec.attention_factor(params))


def inv_freq_switch(params: RopeParameters) -> tuple[int, np.ndarray] | None:
    """Where the frequencies change once with the batch: (L, float32 inv_freq of batches whose seq_len > L).

    Up to L, `inv_freq_and_attention_factor(params)` holds. longrope: L = original_max_position_embeddings,
    the long factors past it. None for the other types (dynamic rescales at every length past
    max_position_embeddings, a graph limited to those positions never does); the attention factor does not switch.
    """
    spec = rope_type_spec(params.rope_type)
    if spec.switch_length is None:
        return None
    length = spec.switch_length(params)
    return length, spec.inv_freq(params, length + 1).astype(F32)


def _expand(table: np.ndarray, layout: Layout) -> np.ndarray:
    """[rows, d/2] → [rows, d]: `cat(t, t)` (half, rotate_half) or each column twice (interleaved, GPT-J)."""
    if layout == "half":
        return np.concatenate([table, table], axis=1)  # [rows, d]
    return np.repeat(table, 2, axis=1)  # [rows, d]


def rope_cos_sin(
    params: RopeParameters,
    max_position: int,
    offset: int = 0,
    layout: Layout = "half",
    form: Form = "full",
    dtype: npt.DTypeLike | str = np.float32,
    rows: slice | None = None,
) -> tuple[np.ndarray, np.ndarray, RopeInfo]:
    """cos and sin tables for positions offset .. offset + max_position - 1.

    Shapes: form="full" → [max_position, table_dim] in `layout` order (half: `cat(freqs, freqs)` as
    LlamaRotaryEmbedding.forward; interleaved: each pair's value twice, GPT-J); form="half" →
    [max_position, table_dim/2] (one column per frequency: onnx RotaryEmbedding / flash-attention
    cache layout; `layout` does not apply). Both include the attention factor, like transformers'
    cos/sin. For dynamic and longrope the frequencies are those of a batch whose largest position
    is the last row (seq_len = offset + max_position). dtype: numpy dtype or API name
    (float32/float16/bfloat16/float64); values are computed in float64 and cast once. `rows`: only
    these rows of that table (`posenc.models.row_blocks.table_rows`; seq_len stays offset + max_position),
    bit for bit as in the whole table; the first axis then has len(rows) entries.
    """
    if isinstance(max_position, bool) or not isinstance(max_position, int) or max_position < 1:
        raise ParameterError("max_position", f"must be an integer >= 1, got {max_position!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ParameterError("offset", f"must be an integer >= 0, got {offset!r}")
    if layout not in ("half", "interleaved"):
        raise ParameterError("layout", f"must be 'half' or 'interleaved', got {layout!r}")
    if form not in ("full", "half"):
        raise ParameterError("form", f"must be 'full' or 'half', got {form!r}")
    out_dtype = np_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)

    seq_len = offset + max_position
    span = table_rows(rows, max_position)
    inv_freq, attention_factor = inv_freq_and_attention_factor(params, seq_len)
    positions = np.arange(offset + span.start, offset + span.stop, dtype=np.float64)  # [rows]
    angles = positions[:, None] * inv_freq.astype(np.float64)[None, :]  # [rows, table_dim/2]
    cos, sin = np.cos(angles), np.sin(angles)
    if attention_factor != 1.0:
        cos *= attention_factor
        sin *= attention_factor
    cos_out, sin_out = cast(cos, out_dtype), cast(sin, out_dtype)
    if form == "full":
        cos_out, sin_out = _expand(cos_out, layout), _expand(sin_out, layout)
    batch_info = rope_type_spec(params.rope_type).batch_info(params, seq_len)
    info = RopeInfo(inv_freq=inv_freq, attention_factor=attention_factor, seq_len=seq_len, **batch_info)
    return cos_out, sin_out, info
