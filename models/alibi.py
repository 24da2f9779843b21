"""ALiBi (Press et al. 2022, arXiv:2108.12409): per-head slopes and the linear biases they scale.

References: the paper's code (ofirpress/attention_with_linear_biases, fairseq `get_slopes`),
llm-foundry / MPT `gen_slopes` (the `alibi_bias_max` generalisation), and Hugging Face
transformers 5.23.0 `models/bloom/modeling_bloom.py` (`_get_alibi_slopes`, `build_alibi_tensor`)
and `models/mpt/modeling_mpt.py` (`build_mpt_alibi_tensor`).
"""

import math
from typing import Literal

import numpy as np

from posenc.models.dtypes import FloatDType, cast, np_dtype
from posenc.models.errors import ParameterError
from posenc.models.relative import check_lengths, head_blocks, key_minus_query, toeplitz_heads_view, toeplitz_view

AlibiMode = Literal["causal", "symmetric", "bloom", "mpt"]
ALIBI_MODES: tuple[str, ...] = ("causal", "symmetric", "bloom", "mpt")
DEFAULT_ALIBI_BIAS_MAX = 8.0  # the paper's slopes 2^(−8k/n); MPT's alibi_bias_max default


def check_alibi_parameters(num_heads: int, alibi_bias_max: float) -> None:
    """num_heads >= 1; alibi_bias_max a finite positive number (slopes 2^(−k·max/N) must lie in (0, 1))."""
    if num_heads < 1:
        raise ParameterError("num_heads", f"must be >= 1, got {num_heads}")
    if not (math.isfinite(alibi_bias_max) and alibi_bias_max > 0):
        raise ParameterError("alibi_bias_max", f"must be a finite number > 0, got {alibi_bias_max}")


def _ceil_power_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _floor_power_of_two(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _interleave_extras(block_of_2c: np.ndarray, num_heads: int) -> np.ndarray:
    """MPT's reordering of the 2^ceil(log2 n) sequence: even steps (the c-head block) then odd steps."""
    return np.concatenate([block_of_2c[1::2], block_of_2c[0::2]])[:num_heads]  # [num_heads]


def alibi_slopes(num_heads: int, alibi_bias_max: float = DEFAULT_ALIBI_BIAS_MAX) -> np.ndarray:
    """Head slopes in the paper's ordering, float64 [num_heads].

    With N = 2^ceil(log2 n), slope_k = 2^(−k · alibi_bias_max / N) for k = 1..N; a power-of-two n
    takes them all (head 0 steepest); otherwise the even steps (= the paper's 2^floor(log2 n)-head
    sequence) come first, then the odd steps (the paper's extras, every other slope of the 2c
    sequence) until n heads. This is MPT's `gen_slopes`, which equals the paper for
    alibi_bias_max = 8 (n = 12: 0.5, 0.25, …, 0.00390625, 0.7071, 0.3536, 0.1768, 0.0884).
    """
    check_alibi_parameters(num_heads, alibi_bias_max)
    n_pow2 = _ceil_power_of_two(num_heads)
    exponents = np.arange(1, n_pow2 + 1, dtype=np.float64) * (alibi_bias_max / n_pow2)  # [N]
    slopes = np.exp2(-exponents)
    return slopes if n_pow2 == num_heads else _interleave_extras(slopes, num_heads)


def bloom_slopes(num_heads: int, alibi_bias_max: float = DEFAULT_ALIBI_BIAS_MAX) -> np.ndarray:
    """BLOOM's float32 slopes, `_get_alibi_slopes`: float32 base 2^(−max/c) raised to integer powers.

    c = 2^floor(log2 n); heads 0..c−1 get base^k (k = 1..c), the extras extra_base^k for odd k,
    extra_base = 2^(−max/(2c)) in float32. Rounding the base to float32 first is what makes these
    differ from the paper's slopes (<= 5.5e-8 up to 80 heads; the error grows with the power).
    Each power is the correctly rounded float32 of the exact power; torch's float32 pow (measured
    on x86 CPU, torch 2.13) is one ulp off for a few (n, k), e.g. head 14 for n >= 32, so those
    heads differ from transformers by one slope ulp. Returns float32 [num_heads].
    """
    check_alibi_parameters(num_heads, alibi_bias_max)
    block = _floor_power_of_two(num_heads)
    powers = np.arange(1, block + 1, dtype=np.float64)  # [c]
    slopes = _float32_power(2.0 ** (-alibi_bias_max / block), powers)
    if block == num_heads:
        return slopes
    extra_powers = np.arange(1, 2 * (num_heads - block), 2, dtype=np.float64)  # [n − c]
    extras = _float32_power(2.0 ** (-alibi_bias_max / (2 * block)), extra_powers)
    return np.concatenate([slopes, extras])  # [num_heads]


def _float32_power(base: float, powers: np.ndarray) -> np.ndarray:
    """float32(base) ** powers, each correctly rounded to float32 (float64 pow is exact enough)."""
    return (np.float64(np.float32(base)) ** powers).astype(np.float32)


def mpt_slopes(num_heads: int, alibi_bias_max: float = DEFAULT_ALIBI_BIAS_MAX) -> np.ndarray:
    """MPT's float32 slopes as `build_mpt_alibi_tensor` computes them: 1 / 2^(k · (max / N)).

    The exponent k · (max / N) is a float32 product, 2^x the correctly rounded float32, and the
    reciprocal a float32 division, then MPT's reordering. Returns float32 [num_heads].
    """
    check_alibi_parameters(num_heads, alibi_bias_max)
    n_pow2 = _ceil_power_of_two(num_heads)
    exponents = np.arange(1, n_pow2 + 1).astype(np.float32) * np.float32(alibi_bias_max / n_pow2)  # [N]
    # past 2^128 the reference's float32 power is inf too (its slope 0): the overflow is the reference's value
    with np.errstate(over="ignore"):
        powers = np.exp2(exponents.astype(np.float64)).astype(np.float32)
    slopes = np.float32(1.0) / powers
    return slopes if n_pow2 == num_heads else _interleave_extras(slopes, num_heads)


def alibi_bias(
    num_heads: int,
    query_length: int,
    key_length: int,
    mode: AlibiMode = "causal",
    mask: bool = False,
    alibi_bias_max: float = DEFAULT_ALIBI_BIAS_MAX,
    dtype: FloatDType = "float32",
) -> np.ndarray:
    """ALiBi bias [num_heads, query_length, key_length] in `dtype`.

    Query row i sits at absolute position p_i = key_length − query_length + i (rows aligned to the
    end of the keys, as with a KV cache); key column j at position j. Per head slope m:

    - `causal`:    −m · (p_i − j), float64 from `alibi_slopes`, cast once (flash-attn's form).
    - `symmetric`: −m · |p_i − j|, same (bidirectional encoders; llm-foundry `full=True`).
    - `bloom`:     +m · j, equal to HF `build_alibi_tensor` for an all-ones mask, broadcast over
      rows: `bloom_slopes` times j in float32 (as BLOOM), then cast to `dtype`.
    - `mpt`:       m · (j − (key_length − 1)), equal to HF `build_mpt_alibi_tensor(num_heads,
      key_length)`: `mpt_slopes` times the offset in float32, then cast to `dtype`.

    `mask=True` puts −inf where a causal query may not attend (j > p_i) in every mode. With
    query_length > key_length the first rows lie before the first key and are fully masked.

    Work is O(num_heads · (q · k + q + k)) whatever the split between heads and lengths: the values
    are evaluated per (head, offset) and laid out by strided copies, a block of heads at a time
    (`head_blocks`). Peak working memory beyond the output: the float64 slopes [num_heads] (8 bytes
    a head, twice while `alibi_slopes` computes them) and one block's temporaries, O(PER_OFFSET_BLOCK
    + q + k) values (float64 products [block, q + k − 1] and their cast; bloom/mpt: [block, key_length]
    in float64, float32 and `dtype`), about 1 MiB unless one head's q + k − 1 exceeds 2^16. Never
    the [num_heads, q + k − 1] float64 table of all heads: with q = 1 or k = 1 that alone would be
    4× a float16 output, 2× a float32 one.
    """
    check_lengths(query_length, key_length)
    check_alibi_parameters(num_heads, alibi_bias_max)
    if mode not in ALIBI_MODES:
        raise ParameterError("mode", f"must be one of {', '.join(ALIBI_MODES)}, got {mode!r}")
    out_dtype = np_dtype(dtype)
    out = np.empty((num_heads, query_length, key_length), dtype=out_dtype)
    # key − query position j − p_i for every distinct offset, as `toeplitz_view` lays it out
    key_minus_position = key_minus_query(query_length, key_length) - (key_length - query_length)
    if mode in ("causal", "symmetric"):
        distance = key_minus_position if mode == "causal" else -np.abs(key_minus_position)  # int64 [q + k − 1]
        slopes = alibi_slopes(num_heads, alibi_bias_max)  # float64 [num_heads]
        for heads in head_blocks(num_heads, query_length, key_length):
            # the same float64 slope × distance products as one head at a time, then the one cast
            per_offset = cast(slopes[heads, None] * distance[None, :], out_dtype)  # [block, q + k − 1]
            out[heads] = toeplitz_heads_view(per_offset, query_length, key_length)  # [block, q, k]
    else:
        slopes, keys = _key_only_factors(num_heads, key_length, mode, alibi_bias_max)
        # rows do not depend on the query: cast [block, key_length] once, broadcast over the q rows
        for heads in head_blocks(num_heads, 1, key_length):
            out[heads] = cast(_key_only_rows(slopes[heads], keys), out_dtype)[:, None, :]
    if mask:
        future = toeplitz_view(key_minus_position > 0, query_length, key_length)  # [q, k] bool
        np.copyto(out, out_dtype.type(-np.inf), where=future[None, :, :])  # broadcast over heads
    return out


def _key_only_factors(
    num_heads: int, key_length: int, mode: AlibiMode, alibi_bias_max: float
) -> tuple[np.ndarray, np.ndarray]:
    """BLOOM/MPT factors: float32 slopes [num_heads] and int64 key terms [key_length] (MPT: ending at 0)."""
    if mode == "bloom":
        return bloom_slopes(num_heads, alibi_bias_max), np.arange(key_length)
    return mpt_slopes(num_heads, alibi_bias_max), np.arange(key_length) - (key_length - 1)


def _key_only_rows(slopes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """BLOOM/MPT rows [heads, key_length] in float32: float32 slopes [heads] × int64 keys [key_length].

    The float64 product of a float32 slope and an integer below 2^24 is exact, so one rounding to
    float32 equals the references' float32 multiply.
    """
    product = slopes.astype(np.float64)[:, None] * keys[None, :]  # [heads, key_length]
    return product.astype(np.float32)
