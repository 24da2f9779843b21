"""ALiBi head slopes and bias tensors (docs/ENCODINGS.md §5)."""

from typing import Annotated

from pydantic import Field

from posenc.models.alibi import DEFAULT_ALIBI_BIAS_MAX, AlibiMode, alibi_bias, alibi_slopes, check_alibi_parameters
from posenc.models.bounds import MAX_ALIBI_BIAS_MAX, MAX_HEADS, MAX_SEQUENCE
from posenc.models.dtypes import cast, np_dtype
from posenc.service.codec.encode import Bundle
from posenc.service.tables.fields import FloatDTypeField
from posenc.service.tables.registry import TableQuery, TensorSpec, register_table

NumHeads = Annotated[int, Field(ge=1, le=MAX_HEADS, description="Number of attention heads (any count, powers of "
                                                                "two or not).")]
AlibiBiasMax = Annotated[float, Field(
    gt=0, le=MAX_ALIBI_BIAS_MAX,
    description="MPT's `alibi_bias_max`: slopes are 2^(−k·max/N), N = 2^ceil(log2 num_heads). "
                "8 (default) is the paper's value.")]


class AlibiSlopesQuery(TableQuery):
    """Power-of-two heads get 2^(−8k/n); other counts the 2^floor(log2 n) block first, then the
    odd-step extras of the next power of two (paper code / MPT `gen_slopes`). Computed in float64,
    cast once to `dtype`.
    """

    endpoint = "alibi/slopes"
    preset_table = "alibi"
    tensors = ("slopes",)

    num_heads: NumHeads
    alibi_bias_max: AlibiBiasMax = DEFAULT_ALIBI_BIAS_MAX
    dtype: FloatDTypeField = "float32"

    def check(self) -> None:
        check_alibi_parameters(self.num_heads, self.alibi_bias_max)

    def specs(self) -> dict[str, TensorSpec]:
        return {"slopes": TensorSpec((self.num_heads,), np_dtype(self.dtype))}

    def compute(self) -> Bundle:
        return Bundle({"slopes": cast(alibi_slopes(self.num_heads, self.alibi_bias_max), np_dtype(self.dtype))})


class AlibiBiasQuery(TableQuery):
    """The bias added to the attention logits of each head, in the form the chosen `mode` names."""

    endpoint = "alibi/bias"
    preset_table = "alibi"
    tensors = ("bias",)

    num_heads: NumHeads
    query_length: int = Field(ge=1, le=MAX_SEQUENCE, description=(
        "Number of query rows; row i is the query at position key_length − query_length + i "
        "(rows aligned to the end of the keys, as when decoding with a KV cache)."))
    key_length: int = Field(ge=1, le=MAX_SEQUENCE, description="Number of key columns (positions 0..).")
    mode: AlibiMode = Field("causal", description=(
        "causal: −m·(i−j) (flash-attn's form); symmetric: −m·|i−j| (bidirectional encoders); "
        "bloom: +m·j, equal to transformers' build_alibi_tensor (BLOOM's float32 slopes and product); "
        "mpt: m·(j−(key_length−1)), equal to build_mpt_alibi_tensor (float32). causal and symmetric "
        "are computed in float64 and cast once; bloom and mpt are the references' float32 values cast "
        "to dtype."))
    mask: bool = Field(False, description="Put −inf where a causal query may not attend (keys after the query's "
                                          "position).")
    alibi_bias_max: AlibiBiasMax = DEFAULT_ALIBI_BIAS_MAX
    dtype: FloatDTypeField = "float32"

    def check(self) -> None:
        check_alibi_parameters(self.num_heads, self.alibi_bias_max)

    def specs(self) -> dict[str, TensorSpec]:
        return {"bias": TensorSpec((self.num_heads, self.query_length, self.key_length), np_dtype(self.dtype))}

    def compute(self) -> Bundle:
        values = alibi_bias(self.num_heads, self.query_length, self.key_length, self.mode, self.mask,
                            self.alibi_bias_max, self.dtype)
        return Bundle({"bias": values}, {"first_query_position": str(self.key_length - self.query_length)})


register_table("/v1/alibi/slopes", AlibiSlopesQuery, summary="ALiBi slopes in the paper's head ordering",
               response_description="Tensor `slopes` [num_heads].")
register_table("/v1/alibi/bias", AlibiBiasQuery, summary="ALiBi bias [num_heads, query_length, key_length]",
               response_description="Tensor `bias` [num_heads, query_length, key_length].")
