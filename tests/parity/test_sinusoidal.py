"""Sinusoidal tables against the reference implementations and docs/ENCODINGS.md §6 reference values."""

import math

import numpy as np
import pytest
import torch
from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

from posenc.models.errors import ParameterError
from posenc.models.sinusoidal import sinusoidal_table

# References that compute in float64 and cast to float32 agree with ours to float32 rounding (<= 1 ulp).
F32_ROUNDING = 1.2e-7
# fairseq/M2M100 multiply position x frequency in float32: angle error up to |angle| * 2^-24.
def fairseq_tolerance(positions: int) -> float:
    return 2e-7 + 1.2e-7 * positions


DIMS = [1, 2, 3, 4, 5, 8, 33, 64, 128, 512]
LENGTHS = [1, 7, 300]


def tensor2tensor_reference(length: int, channels: int, max_timescale: float, start_index: int) -> np.ndarray:
    """tensor2tensor `get_timing_signal_1d` (min_timescale 1) transcribed from its documented formula."""
    positions = np.arange(length, dtype=np.float64) + start_index
    num_timescales = channels // 2
    log_increment = math.log(max_timescale) / max(num_timescales - 1, 1)
    inv_timescales = np.exp(np.arange(num_timescales, dtype=np.float64) * -log_increment)
    scaled = positions[:, None] * inv_timescales[None, :]
    signal = np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)
    return np.pad(signal, [[0, 0], [0, channels % 2]])


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("length", LENGTHS)
def test_paper_equals_hf_xlm(dim: int, length: int) -> None:
    ref = torch.empty(length, dim)
    create_sinusoidal_embeddings(length, dim, ref)
    ours = sinusoidal_table(length, dim, "paper", dtype=np.float32)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=0, atol=F32_ROUNDING)


@pytest.mark.parametrize("dim", [2, 4, 8, 64, 512])
def test_paper_equals_annotated_transformer_formula(dim: int) -> None:
    # harvardnlp PositionalEncoding: div_term = exp(arange(0, d, 2) * -(ln 10000 / d)), interleaved.
    position = np.arange(50, dtype=np.float64)[:, None]
    div_term = np.exp(np.arange(0, dim, 2) * -(math.log(10000.0) / dim))
    ref = np.zeros((50, dim))
    ref[:, 0::2] = np.sin(position * div_term)
    ref[:, 1::2] = np.cos(position * div_term)
    np.testing.assert_allclose(sinusoidal_table(50, dim, "paper", dtype=np.float64), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("length", LENGTHS)
def test_marian_equals_hf(dim: int, length: int) -> None:
    ref = MarianSinusoidalPositionalEmbedding(length, dim).create_weight()
    ours = sinusoidal_table(length, dim, "marian", dtype=np.float32)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=0, atol=F32_ROUNDING)


@pytest.mark.parametrize("dim", [4, 5, 8, 33, 64, 128, 512])
@pytest.mark.parametrize("length", [7, 300])
@pytest.mark.parametrize("padding_idx", [0, 1, 5])
def test_fairseq_equals_hf_m2m100(dim: int, length: int, padding_idx: int) -> None:
    ref = M2M100SinusoidalPositionalEmbedding.get_embedding(length, dim, padding_idx)
    ours = sinusoidal_table(length, dim, "fairseq", padding_idx=padding_idx, dtype=np.float32)
    np.testing.assert_allclose(ours, ref.numpy(), rtol=0, atol=fairseq_tolerance(length))
    assert not ours[padding_idx].any()


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("offset", [0, 5, 1000])
@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_tensor2tensor_equals_reference_formula(dim: int, offset: int, base: float) -> None:
    ours = sinusoidal_table(64, dim, "tensor2tensor", base=base, offset=offset, dtype=np.float64)
    np.testing.assert_allclose(ours, tensor2tensor_reference(64, dim, base, offset), rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["paper", "tensor2tensor", "fairseq", "marian"])
def test_offset_is_a_slice_of_the_full_table(variant: str) -> None:
    full = sinusoidal_table(200, 16, variant, dtype=np.float64)  # type: ignore[arg-type]
    part = sinusoidal_table(50, 16, variant, offset=120, dtype=np.float64)  # type: ignore[arg-type]
    np.testing.assert_array_equal(part, full[120:170])


def test_reference_values_fairseq_dim8() -> None:
    # docs/ENCODINGS.md §6 (measured with fairseq, dim 8, padding_idx 1).
    table = sinusoidal_table(3, 8, "fairseq", padding_idx=1, dtype=np.float64)
    np.testing.assert_allclose(table[2], [0.9093, 0.0927, 0.00431, 0.0002, -0.4161, 0.9957, 1.0, 1.0], atol=6e-5)
    assert not table[1].any()
    np.testing.assert_array_equal(table[0], [0, 0, 0, 0, 1, 1, 1, 1])
    # Frequencies: fairseq omega = [1, 0.046416, 0.0021544, 0.0001], paper omega = [1, 0.1, 0.01, 0.001].
    fairseq_omega = sinusoidal_table(2, 8, "tensor2tensor", offset=0, dtype=np.float64)[1, :4]
    np.testing.assert_allclose(np.arcsin(fairseq_omega), [1, 0.046416, 0.0021544, 0.0001], rtol=1e-4)
    paper_row = sinusoidal_table(2, 8, "paper", dtype=np.float64)[1, 0::2]
    np.testing.assert_allclose(np.arcsin(paper_row), [1, 0.1, 0.01, 0.001], rtol=1e-9)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_cast_once_from_float64(dtype: type) -> None:
    exact = sinusoidal_table(100, 24, "paper", dtype=np.float64)
    np.testing.assert_array_equal(sinusoidal_table(100, 24, "paper", dtype=dtype), exact.astype(dtype))


@pytest.mark.parametrize("dim", [2, 3])
def test_fairseq_small_dims_rejected_like_the_reference(dim: int) -> None:
    with pytest.raises(ZeroDivisionError):
        M2M100SinusoidalPositionalEmbedding.get_embedding(4, dim, None)
    with pytest.raises(ParameterError) as info:
        sinusoidal_table(4, dim, "fairseq")
    assert info.value.parameter == "dim"


@pytest.mark.parametrize(("kwargs", "parameter"), [
    ({"max_position": 0, "dim": 8}, "max_position"),
    ({"max_position": 4, "dim": 0}, "dim"),
    ({"max_position": 4, "dim": 8, "base": 0.0}, "base"),
    ({"max_position": 4, "dim": 8, "variant": "rotary"}, "variant"),
])
def test_invalid_parameters_name_the_parameter(kwargs: dict, parameter: str) -> None:
    with pytest.raises(ParameterError) as info:
        sinusoidal_table(**kwargs)
    assert info.value.parameter == parameter
