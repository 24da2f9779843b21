"""Numeric core of the bias family against transformers 5.23.0, the ALiBi paper and docs/ENCODINGS.md.

Integer tables (T5, DeBERTa, clipped) and the BLOOM/MPT biases are compared for exact equality.
"""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from transformers import T5Config
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes, build_alibi_tensor
from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position, make_log_bucket_position
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
from transformers.models.t5.modeling_t5 import T5Attention

from posenc.models.alibi import alibi_bias, alibi_slopes, bloom_slopes, mpt_slopes
from posenc.models.deberta import deberta_buckets, deberta_log_bucket_position
from posenc.models.errors import ParameterError
from posenc.models.relative import clipped_relative_indices
from posenc.models.t5 import t5_bias, t5_buckets, t5_relative_position_bucket
from tests.traced_memory import traced_peak

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                "float64": torch.float64}
HEADS = list(range(1, 81))
LENGTHS = [(1, 1), (1, 7), (7, 7), (5, 13), (13, 5), (3, 300), (1, 2048)]
T5_SETTINGS = [(nb, md) for nb in (8, 16, 32, 64) for md in (16, 128, 256)]


def paper_slopes(n: int) -> list[float]:
    """ofirpress/attention_with_linear_biases `get_slopes`, in Python floats."""
    def power_of_two(m: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(m) - 3)))
        return [start * start**i for i in range(m)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_two(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


# --------------------------------------------------------------------------------------- slopes


def test_slopes_equal_the_paper_formula() -> None:
    for n in [*range(1, 257), 1000, 4096]:
        ours, paper = alibi_slopes(n), np.array(paper_slopes(n))
        # the paper multiplies start · start**i, which drifts by a few ulps over thousands of heads
        np.testing.assert_allclose(ours, paper, rtol=1e-13, atol=0)
        np.testing.assert_array_equal(ours.astype(np.float32), paper.astype(np.float32))


def test_slopes_reference_value_12_heads() -> None:
    expected = [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
                0.70711, 0.35355, 0.17678, 0.08839]
    np.testing.assert_allclose(alibi_slopes(12), expected, atol=5e-6)
    assert alibi_slopes(12)[8] == 2**-0.5


@pytest.mark.parametrize("alibi_bias_max", [1.0, 4.0, 6.0, 12.5, 16.0])
@pytest.mark.parametrize("n", [1, 3, 8, 12, 40, 71])
def test_alibi_bias_max_generalises_like_mpt(n: int, alibi_bias_max: float) -> None:
    reference = -build_mpt_alibi_tensor(n, 2, alibi_bias_max)[:, 0, 0].numpy()  # slope × (0 − 1)
    np.testing.assert_allclose(alibi_slopes(n, alibi_bias_max), reference, rtol=2**-22)
    assert_equal_where_slopes_agree(mpt_slopes(n, alibi_bias_max), reference, mpt_slopes(n, alibi_bias_max),
                                    reference)


def assert_equal_where_slopes_agree(ours: np.ndarray, ref: np.ndarray, our_slopes: np.ndarray,
                                    ref_slopes: np.ndarray) -> None:
    """Heads whose float32 slopes agree must be bit-equal; torch's float32 pow is off by up to one ulp for a
    few (n, k) (which ones depends on the CPU: its vectorised pow on AVX2/AVX-512, the C library's
    elsewhere), and MPT's `1 / pow` turns one ulp of the power into up to two of the slope (the relative
    error stays, an ulp's relative size halves across a binade): those heads may differ by two slope ulps
    times the position, and must be rare."""
    agree = our_slopes == ref_slopes
    np.testing.assert_array_equal(ours[agree], ref[agree])
    ulps = np.abs(our_slopes.view(np.int32) - ref_slopes.view(np.int32))
    assert ulps.max() <= 2 and (~agree).sum() <= max(1, len(agree) // 16)
    np.testing.assert_allclose(ours[~agree], ref[~agree], rtol=2**-22)


@pytest.mark.parametrize("n", [*range(1, 81, 3), 12, 40, 71, 80, 128, 200])
def test_bloom_and_mpt_slopes_match_transformers(n: int) -> None:
    assert_equal_where_slopes_agree(bloom_slopes(n), _get_alibi_slopes(n, "cpu").numpy(),
                                    bloom_slopes(n), _get_alibi_slopes(n, "cpu").numpy())
    mpt_ref = -build_mpt_alibi_tensor(n, 2)[:, 0, 0].numpy()
    assert_equal_where_slopes_agree(mpt_slopes(n), mpt_ref, mpt_slopes(n), mpt_ref)
    # BLOOM rounds the base to float32 first: the error grows with the power (≤ 5.5e-8 up to 80 heads)
    np.testing.assert_allclose(bloom_slopes(n), paper_slopes(n), rtol=n * 2**-24 + 2**-23, atol=0)
    if n <= 80:
        np.testing.assert_allclose(bloom_slopes(n), paper_slopes(n), rtol=0, atol=6e-8)


# ---------------------------------------------------------------------------------------- biases


def alibi_grid(num_heads: int) -> list[tuple[int, int, str]]:
    """(q, k, dtype) points: every dtype on short keys, 2048 keys for a few head counts."""
    lengths = [(1, 1), (3, 7), (9, 300)] + ([(2, 2048)] if num_heads in (12, 32, 40, 71, 80) else [])
    return [(q, k, dtype) for q, k in lengths for dtype in TORCH_DTYPES]


@pytest.mark.parametrize("num_heads", HEADS)
def test_bloom_mode_equals_build_alibi_tensor(num_heads: int) -> None:
    ref_slopes = _get_alibi_slopes(num_heads, "cpu").numpy()
    for q, k, dtype in alibi_grid(num_heads):
        torch_dtype = TORCH_DTYPES[dtype]
        ours = alibi_bias(num_heads, q, k, "bloom", dtype=dtype)  # type: ignore[arg-type]  # [h, q, k]
        ref = build_alibi_tensor(torch.ones(1, k), num_heads, torch_dtype)  # [h, 1, k]
        assert ours.dtype == (ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype))
        assert (ours == ours[:, :1, :]).all()  # broadcast over query rows
        assert_equal_where_slopes_agree(ours[:, 0, :].astype(np.float64), ref.double().numpy()[:, 0, :],
                                        bloom_slopes(num_heads), ref_slopes)


@pytest.mark.parametrize("num_heads", HEADS)
def test_mpt_mode_equals_build_mpt_alibi_tensor(num_heads: int) -> None:
    ref_slopes = -build_mpt_alibi_tensor(num_heads, 2)[:, 0, 0].numpy()
    for q, k, dtype in alibi_grid(num_heads):
        torch_dtype = TORCH_DTYPES[dtype]
        ours = alibi_bias(num_heads, q, k, "mpt", dtype=dtype)  # type: ignore[arg-type]
        ref = build_mpt_alibi_tensor(num_heads, k).to(torch_dtype)  # [h, 1, k], float32 then cast
        assert (ours == ours[:, :1, :]).all()
        assert_equal_where_slopes_agree(ours[:, 0, :].astype(np.float64), ref.double().numpy()[:, 0, :],
                                        mpt_slopes(num_heads), ref_slopes)


def expected_relative(num_heads: int, q: int, k: int, mode: str) -> np.ndarray:
    """Direct float64 broadcast of −m·(p_i − j) / −m·|p_i − j| with p_i = k − q + i."""
    m = alibi_slopes(num_heads)[:, None, None]  # [h, 1, 1]
    distance = (k - q + np.arange(q))[:, None] - np.arange(k)[None, :]  # [q, k]
    return -m * (distance if mode == "causal" else np.abs(distance))  # [h, q, k]


@pytest.mark.parametrize("mode", ["causal", "symmetric"])
@pytest.mark.parametrize("num_heads", [1, 12, 40, 71])
@pytest.mark.parametrize(("q", "k"), [(1, 1), (5, 13), (13, 5), (64, 64), (1, 2048)])
def test_causal_and_symmetric_are_float64_cast_once(num_heads: int, q: int, k: int, mode: str) -> None:
    exact = expected_relative(num_heads, q, k, mode) + 0.0  # + 0.0 turns −0.0 into 0.0
    for dtype in ("float64", "float32", "float16", "bfloat16"):
        target = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
        got = alibi_bias(num_heads, q, k, mode, dtype=dtype)  # type: ignore[arg-type]
        assert got.dtype == target and got.flags.c_contiguous
        np.testing.assert_array_equal(got, exact.astype(target))
        assert not np.signbit(got[got == 0]).any()  # no −0.0 on the diagonal


def test_causal_is_bloom_shifted_per_row_and_symmetric_is_flash_attn() -> None:
    h, q, k = 12, 6, 10
    causal = alibi_bias(h, q, k, "causal", dtype="float64")
    m = alibi_slopes(h)[:, None, None]
    rows = (k - q + np.arange(q))[None, :, None]  # absolute query positions [1, q, 1]
    np.testing.assert_allclose(causal, m * np.arange(k)[None, None, :] - m * rows, rtol=0, atol=1e-12)
    flash = -m * np.abs(np.arange(q)[:, None] + k - q - np.arange(k)[None, :])
    np.testing.assert_array_equal(alibi_bias(h, q, k, "symmetric", dtype="float64"), flash)


@pytest.mark.parametrize("mode", ["causal", "symmetric", "bloom", "mpt"])
@pytest.mark.parametrize(("q", "k"), [(1, 1), (4, 9), (9, 4), (16, 16)])
def test_mask_is_minus_inf_exactly_on_future_keys(mode: str, q: int, k: int) -> None:
    masked = alibi_bias(5, q, k, mode, mask=True)  # type: ignore[arg-type]
    plain = alibi_bias(5, q, k, mode)  # type: ignore[arg-type]
    future = np.arange(k)[None, :] > (k - q + np.arange(q))[:, None]  # [q, k]
    assert np.isneginf(masked[:, future]).all()
    np.testing.assert_array_equal(masked[:, ~future], plain[:, ~future])
    assert np.isfinite(plain).all()


@pytest.mark.parametrize(("call", "parameter"), [
    (lambda: alibi_slopes(0), "num_heads"), (lambda: alibi_slopes(-3), "num_heads"),
    (lambda: alibi_slopes(8, 0.0), "alibi_bias_max"), (lambda: alibi_slopes(8, math.nan), "alibi_bias_max"),
    (lambda: alibi_bias(8, 0, 4), "query_length"), (lambda: alibi_bias(8, 4, 0), "key_length"),
    (lambda: alibi_bias(8, 4, 4, "t5"), "mode"),  # type: ignore[arg-type]
    (lambda: t5_buckets(4, 4, True, 33, 8), "max_distance"), (lambda: t5_buckets(4, 4, True, 3, 8), "num_buckets"),
    (lambda: t5_buckets(4, 4, False, 1, 8), "num_buckets"), (lambda: t5_buckets(4, 4, False, 32, 16), "max_distance"),
    (lambda: t5_buckets(4, 4, offset=-1), "offset"),
    (lambda: t5_bias(np.zeros((16, 2)), 2, 2), "weight"), (lambda: t5_bias(np.zeros(32), 2, 2), "weight"),
    (lambda: t5_bias(np.zeros((32, 0)), 2, 2), "weight"),
    (lambda: deberta_buckets(4, 4, 1, 512), "position_buckets"),
    (lambda: deberta_buckets(4, 4, 256, 129), "max_relative_positions"),
    (lambda: clipped_relative_indices(4, 4, -1), "max_relative_position"),
])
def test_bad_values_raise_parameter_error_naming_the_parameter(call, parameter: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ParameterError) as info:
        call()
    assert info.value.parameter == parameter and parameter in str(info.value)


# -------------------------------------------------------------------------------------------- T5


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [*T5_SETTINGS, (33, 128), (7, 20), (4, 2), (2, 3)])
def test_t5_bucket_function_is_bit_exact(num_buckets: int, max_distance: int, bidirectional: bool) -> None:
    rel = np.arange(-3000, 3001)
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    if max_exact < 1 or max_distance <= max_exact:
        with pytest.raises(ParameterError):
            t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
        return
    ref = T5Attention._relative_position_bucket(torch.from_numpy(rel), bidirectional, num_buckets, max_distance)
    np.testing.assert_array_equal(t5_relative_position_bucket(rel, bidirectional, num_buckets, max_distance),
                                  ref.numpy())


def test_t5_float32_rule_matters() -> None:
    """(19 buckets, bidirectional, 128): float64 logs put |rel| = 8, 16, 64 one bucket lower."""
    rel = -np.array([8, 16, 64])
    ref = T5Attention._relative_position_bucket(torch.from_numpy(rel), True, 19, 128).numpy()
    np.testing.assert_array_equal(t5_relative_position_bucket(rel, True, 19, 128), ref)
    float64_rule = 4 + np.trunc(np.log(-rel / 4) / math.log(128 / 4) * 5).astype(np.int64)
    assert (float64_rule != ref).all()


def first_rel_of_each_bucket(bidirectional: bool) -> list[int]:
    buckets = t5_relative_position_bucket(-np.arange(0, 200), bidirectional)
    return [int(np.argmax(buckets == b)) for b in range(int(buckets.max()) + 1)]


def test_t5_reference_boundaries() -> None:
    assert first_rel_of_each_bucket(True) == [*range(8), 8, 12, 16, 23, 32, 46, 64, 91]
    assert first_rel_of_each_bucket(False) == [*range(16), 16, 19, 21, 24, 27, 31, 35, 40, 46, 52, 59, 67,
                                               77, 87, 99, 113]
    assert t5_relative_position_bucket(np.array([1, 8, 16, 128, 10**6])).tolist() == [17, 24, 26, 31, 31]


T5_SHAPES = [(1, 1, 0), (7, 7, 0), (5, 13, 0), (13, 5, 0), (1, 300, 2047), (64, 64, 100), (1, 2048, 0),
             (2048, 1, 0)]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 16), (64, 256), (16, 128), (33, 100)])
@pytest.mark.parametrize(("q", "k", "offset"), T5_SHAPES)
def test_t5_bias_equals_compute_bias(q: int, k: int, offset: int, num_buckets: int, max_distance: int,
                                     bidirectional: bool) -> None:
    heads = [1, 12, 40, 71][(q + k + num_buckets) % 4]
    config = T5Config(num_heads=heads, d_model=8, d_kv=4, relative_attention_num_buckets=num_buckets,
                      relative_attention_max_distance=max_distance, is_decoder=not bidirectional)
    attention = T5Attention(config, has_relative_attention_bias=True)
    weight = torch.randn(num_buckets, heads, generator=torch.Generator().manual_seed(q * k + offset))
    attention.relative_attention_bias.weight.data.copy_(weight)
    with torch.no_grad():
        ref = attention.compute_bias(q, k, past_seen_tokens=offset)[0].numpy()  # [heads, q, k]
    got = t5_bias(weight.numpy(), q, k, bidirectional, num_buckets, max_distance, offset)
    assert got.dtype == np.float32 and got.shape == (heads, q, k)
    np.testing.assert_array_equal(got, ref)
    rel = np.arange(k)[None, :] - (np.arange(q)[:, None] + offset)
    buckets_ref = T5Attention._relative_position_bucket(torch.from_numpy(rel), bidirectional, num_buckets,
                                                        max_distance).numpy()
    np.testing.assert_array_equal(t5_buckets(q, k, bidirectional, num_buckets, max_distance, offset), buckets_ref)
    np.testing.assert_array_equal(t5_buckets(q, k, bidirectional, num_buckets, max_distance, offset, "int32"),
                                  buckets_ref.astype(np.int32))


def test_t5_bias_keeps_the_weight_dtype() -> None:
    weight = np.arange(64, dtype=np.float32).reshape(32, 2).astype(ml_dtypes.bfloat16)
    got = t5_bias(weight, 3, 4)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got, weight.T[:, t5_buckets(3, 4)])


# --------------------------------------------------------------------------------------- DeBERTa


DEBERTA_SETTINGS = [(pb, mp) for pb in (8, 16, 32, 64, 256) for mp in (16, 128, 256, 512) if mp - 1 > pb // 2]


@pytest.mark.parametrize(("position_buckets", "max_relative_positions"), [*DEBERTA_SETTINGS, (3, 5), (255, 1000)])
def test_deberta_log_bucket_is_bit_exact(position_buckets: int, max_relative_positions: int) -> None:
    rel = np.arange(-5000, 5001)
    ref = make_log_bucket_position(torch.from_numpy(rel), position_buckets, max_relative_positions)
    got = deberta_log_bucket_position(rel, position_buckets, max_relative_positions)
    np.testing.assert_array_equal(got, ref.to(torch.long).numpy())


def test_deberta_reference_values() -> None:
    rel = np.array([-600, -511, -300, -200, -129, -128, 129, 200, 300, 511, 512, 600])
    assert deberta_log_bucket_position(rel, 256, 512).tolist() == [-270, -255, -207, -169, -129, -128, 129, 169,
                                                                  207, 255, 256, 270]


@pytest.mark.parametrize(("q", "k"), [(1, 1), (5, 13), (13, 5), (300, 300), (1, 2048), (2048, 3)])
@pytest.mark.parametrize(("position_buckets", "max_relative_positions"), [(256, 512), (64, 128), (32, 256)])
def test_deberta_table_equals_build_relative_position(q: int, k: int, position_buckets: int,
                                                      max_relative_positions: int) -> None:
    ref = build_relative_position(torch.empty(q, 1), torch.empty(k, 1), position_buckets,
                                  max_relative_positions)[0].numpy()
    np.testing.assert_array_equal(deberta_buckets(q, k, position_buckets, max_relative_positions), ref)
    got32 = deberta_buckets(q, k, position_buckets, max_relative_positions, "int32")
    assert got32.dtype == np.int32 and (got32 == ref).all()


# --------------------------------------------------------------------------------------- clipped


@pytest.mark.parametrize("max_relative_position", [0, 1, 4, 16, 5000])
@pytest.mark.parametrize(("q", "k"), [(1, 1), (5, 13), (13, 5), (64, 64)])
def test_clipped_indices(q: int, k: int, max_relative_position: int) -> None:
    kk = max_relative_position
    expected = np.clip(np.arange(k)[None, :] - np.arange(q)[:, None], -kk, kk) + kk  # [q, k]
    got = clipped_relative_indices(q, k, kk)
    assert got.dtype == np.int64 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(clipped_relative_indices(q, k, kk, "int32"), expected.astype(np.int32))


# ---------------------------------------------------------------------------------------- memory


@pytest.mark.parametrize("compute", [
    lambda: alibi_bias(16, 256, 512, "causal", mask=True, dtype="float16"),
    lambda: alibi_bias(16, 256, 512, "symmetric", dtype="float32"),
    lambda: alibi_bias(16, 256, 512, "bloom", mask=True, dtype="bfloat16"),
    lambda: t5_buckets(512, 1024),
    lambda: deberta_buckets(512, 1024, dtype="int32"),
    lambda: t5_bias(np.ones((32, 1), np.float32), 512, 1024),
])
def test_memory_is_proportional_to_the_output(compute) -> None:  # type: ignore[no-untyped-def]
    out, peak = traced_peak(compute)
    assert peak <= 1.3 * out.nbytes + 2**20, (peak, out.nbytes)
