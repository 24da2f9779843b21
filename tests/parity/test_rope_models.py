"""models/rope: parity with transformers 5.23 (ROPE_INIT_FUNCTIONS, rotary forwards), golden values, errors.

Tolerances: tests/rope_reference.py (precision contract of docs/ENCODINGS.md).
"""

import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

from posenc.models.errors import ParameterError
from posenc.models.rope import (
    RopeParameters,
    inv_freq_and_attention_factor,
    make_rope_parameters,
    rope_cos_sin,
    rope_parameters_from_config,
)
from posenc.models.rope import yarn_correction_range as correction_range
from tests.rope_reference import (
    MODEL_CONFIGS,
    assert_inv_freq_close,
    cos_sin_tolerance,
    forward_cos_sin,
    hf_model_rotary,
    llama_config,
    rotary_module,
)

# (head_dim, partial_rotary_factor): rotary dims 64, 32 (80 x 0.4), 80, 96, 48, 128, 32, 256, 64
DIMS = [(64, 1.0), (80, 0.4), (80, 1.0), (96, 1.0), (96, 0.5), (128, 1.0), (128, 0.25), (256, 1.0), (256, 0.25)]
THETAS = [1e4, 5e5, 1e6]
LONG = 131072


def scaling(rope_type: str, rotary_dim: int) -> tuple[dict[str, Any], int]:
    """(rope_parameters extras, max_position_embeddings) of one grid case."""
    half = rotary_dim // 2
    cases: dict[str, tuple[dict[str, Any], int]] = {
        "default": ({}, 4096),
        "linear": ({"factor": 4.0}, 4096),
        "dynamic": ({"factor": 2.0}, 4096),
        "yarn": ({"factor": 4.0, "original_max_position_embeddings": 4096}, 16384),
        "yarn_mscale": ({"factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
                         "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1}, 163840),
        "yarn_untruncated": ({"factor": 8.0, "original_max_position_embeddings": 8192, "truncate": False}, 65536),
        "longrope": ({"short_factor": [1.0 + 0.03 * i for i in range(half)],
                      "long_factor": [1.0 + 0.9 * i for i in range(half)],
                      "original_max_position_embeddings": 4096}, LONG),
        "llama3": ({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}, LONG),
        "proportional": ({"factor": 1.0}, LONG),
        "proportional_scaled": ({"factor": 2.0}, LONG),
    }
    return cases[rope_type]


VARIANTS = ["default", "linear", "dynamic", "yarn", "yarn_mscale", "yarn_untruncated", "longrope", "llama3",
            "proportional", "proportional_scaled"]


def build(variant: str, head_dim: int, prf: float, theta: float) -> tuple[RopeParameters, Any]:
    """Our parameters and the equivalent transformers LlamaConfig."""
    rope_type = variant.split("_")[0]
    extras, max_pos = scaling(variant, int(head_dim * prf))
    hf = llama_config({"rope_type": rope_type, "rope_theta": theta, "partial_rotary_factor": prf, **extras},
                      head_dim, max_pos)
    ours = make_rope_parameters(head_dim=head_dim, partial_rotary_factor=prf, rope_theta=theta, rope_type=rope_type,
                                max_position_embeddings=max_pos, **extras)
    return ours, hf


def hf_init(config: Any, seq_len: int | None) -> tuple[np.ndarray, float]:
    """transformers' inv_freq and attention factor; seq_len as dynamic_rope_update passes it (a tensor)."""
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        inv, factor = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        tensor_len = None if seq_len is None else torch.tensor(seq_len)
        inv, factor = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=tensor_len)
    return inv.numpy(), float(factor)


@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize(("head_dim", "prf"), DIMS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_inv_freq_matches_transformers(variant: str, head_dim: int, prf: float, theta: float) -> None:
    ours, hf = build(variant, head_dim, prf, theta)
    for seq_len in (None, 4096, 4097, 8192, LONG):
        ref, ref_factor = hf_init(hf, seq_len)
        inv, factor = inv_freq_and_attention_factor(ours, seq_len)
        assert_inv_freq_close(inv, ref)
        assert factor == pytest.approx(ref_factor, rel=1e-15)


@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize(("head_dim", "prf"), DIMS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_cos_sin_match_rotary_forward(variant: str, head_dim: int, prf: float, theta: float) -> None:
    """First rows and the last rows before 131072 (offset), each table one forward batch; both layouts."""
    ours, hf = build(variant, head_dim, prf, theta)
    half = ours.n_frequencies
    for offset, rows in ((0, 48), (LONG - 48, 48)):
        positions = np.arange(offset, offset + rows)
        ref_cos, ref_sin = forward_cos_sin(rotary_module(hf), positions)  # [rows, table_dim], half layout
        assert np.array_equal(ref_cos[:, :half], ref_cos[:, half:])
        for layout in ("half", "interleaved"):
            cos, sin, info = rope_cos_sin(ours, rows, offset=offset, layout=layout)  # type: ignore[arg-type]
            tol = cos_sin_tolerance(positions, info.inv_freq, info.attention_factor)  # [rows, d/2]
            for mine, ref in ((cos, ref_cos), (sin, ref_sin)):
                assert mine.shape == ref.shape == (rows, ours.table_dim)
                pairs = (mine[:, :half], mine[:, half:]) if layout == "half" else (mine[:, 0::2], mine[:, 1::2])
                assert np.array_equal(pairs[0], pairs[1])
                assert np.all(np.abs(pairs[0].astype(np.float64) - ref[:, :half]) <= tol)


@pytest.mark.parametrize("variant", VARIANTS)
def test_form_half_is_one_column_per_frequency(variant: str) -> None:
    ours, _ = build(variant, 128, 1.0, 5e5)
    full_cos, full_sin, _ = rope_cos_sin(ours, 40, offset=9000)
    cos, sin, info = rope_cos_sin(ours, 40, offset=9000, form="half")
    assert cos.shape == sin.shape == (40, ours.n_frequencies) == (40, info.inv_freq.shape[0])
    assert np.array_equal(cos, full_cos[:, : ours.n_frequencies])
    assert np.array_equal(sin, full_sin[:, : ours.n_frequencies])


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_run_time_switching_follows_the_batch(rope_type: str) -> None:
    """One transformers module fed growing then shrinking batches; each table equals a fresh table of ours."""
    ours, hf = build(rope_type, 96, 1.0, 1e4)
    module = rotary_module(hf)
    for last in (100, 4096, 4097, 9000, LONG, 200, 4096, 4097):
        positions = np.arange(last - 32, last)
        ref_cos, _ = forward_cos_sin(module, positions)
        cos, _, info = rope_cos_sin(ours, 32, offset=last - 32)
        tol = cos_sin_tolerance(positions, info.inv_freq, info.attention_factor)
        assert np.all(np.abs(cos[:, :48].astype(np.float64) - ref_cos[:, :48]) <= tol), last
        if rope_type == "longrope":
            assert info.factor_set == ("long" if last > 4096 else "short")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_dtypes_cast_once_from_float64(dtype: str) -> None:
    ours, _ = build("yarn", 128, 1.0, 1e4)
    cos64, sin64, _ = rope_cos_sin(ours, 64, offset=5000, dtype=np.float64)
    cos, sin, info = rope_cos_sin(ours, 64, offset=5000, dtype=dtype)
    target = np.float64 if dtype == "float64" else ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    assert cos.dtype == np.dtype(target) and info.inv_freq.dtype == np.float32
    assert np.array_equal(cos, cos64.astype(target)) and np.array_equal(sin, sin64.astype(target))


def test_bfloat16_row_golden() -> None:
    """docs/ENCODINGS.md §1.3: head_dim 8, positions 0..2, bf16: the cat(freqs, freqs) layout is visible."""
    cos, _, _ = rope_cos_sin(make_rope_parameters(head_dim=8), 3, dtype="bfloat16")
    expected = [0.5390625, 0.99609375, 1, 1, 0.5390625, 0.99609375, 1, 1]
    assert cos[1].astype(np.float64).tolist() == expected
    ref_cos, _ = forward_cos_sin(rotary_module(llama_config({"rope_type": "default"}, 8, 16)), np.arange(3),
                                 dtype=torch.bfloat16)
    assert ref_cos[1].tolist() == expected


# --- golden values of docs/ENCODINGS.md §1.2 ----------------------------------------------------------------


def test_yarn_golden() -> None:
    p = make_rope_parameters(head_dim=128, rope_type="yarn", factor=4.0, original_max_position_embeddings=4096)
    assert correction_range(p) == (20, 46)
    untruncated = make_rope_parameters(head_dim=128, rope_type="yarn", factor=4.0,
                                       original_max_position_embeddings=4096, truncate=False)
    low, high = correction_range(untruncated)
    assert (round(low, 3), round(high, 3)) == (20.944, 45.027)
    inv, factor = inv_freq_and_attention_factor(p)
    base, _ = inv_freq_and_attention_factor(make_rope_parameters(head_dim=128))
    assert factor == pytest.approx(1.1386294, abs=1e-7)
    assert np.array_equal(inv[:21], base[:21])  # pairs 0..20 extrapolated (unchanged)
    np.testing.assert_allclose(inv[46:], base[46:] / 4, rtol=3e-7)  # 18 pairs interpolated
    assert inv[21] == pytest.approx(0.0472920, abs=1e-7)
    assert inv[45] == pytest.approx(0.000429403, rel=1e-6)
    inv_u, _ = inv_freq_and_attention_factor(untruncated)
    assert inv_u[21] == pytest.approx(0.0486126, abs=1e-7)
    assert inv_u[45] == pytest.approx(0.000386271, rel=1e-6)


def test_yarn_deepseek_golden() -> None:
    p = make_rope_parameters(head_dim=64, rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                             mscale=1.0, mscale_all_dim=1.0)
    assert correction_range(p) == (10, 23)
    assert inv_freq_and_attention_factor(p)[1] == 1.0


def test_llama3_golden_smoothing() -> None:
    p = make_rope_parameters(head_dim=128, rope_theta=5e5, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=8192)
    inv, _ = inv_freq_and_attention_factor(p)
    base, _ = inv_freq_and_attention_factor(make_rope_parameters(head_dim=128, rope_theta=5e5))
    ratio = base.astype(np.float64) / inv
    assert np.all(ratio[:29] == 1.0) and np.allclose(ratio[35:], 8.0, rtol=3e-7)
    np.testing.assert_allclose(ratio[29:35], [1.2075, 1.5534, 2.0263, 2.6945, 3.6843, 5.2573], atol=1e-4)


def test_longrope_golden() -> None:
    p = make_rope_parameters(head_dim=8, rope_type="longrope", short_factor=[1, 1, 1, 1],
                             long_factor=[2, 2, 2, 2], original_max_position_embeddings=4096,
                             max_position_embeddings=131072)
    assert p.factor == 32.0
    _, factor = inv_freq_and_attention_factor(p)
    assert factor == pytest.approx(1.1902381, abs=1e-7) == math.sqrt(1 + math.log(32) / math.log(4096))
    assert rope_cos_sin(p, 1, offset=4095)[2].factor_set == "short"
    assert rope_cos_sin(p, 1, offset=4096)[2].factor_set == "long"


def test_dynamic_golden() -> None:
    p = make_rope_parameters(head_dim=128, rope_type="dynamic", factor=2.0, max_position_embeddings=4096)
    assert inv_freq_and_attention_factor(p, 4096)[0][1] == pytest.approx(0.865964, abs=1e-6)
    _, _, info = rope_cos_sin(p, 1, offset=8191)
    assert info.dynamic_rope_theta == pytest.approx(30527.74, abs=0.01)
    assert info.inv_freq[1] == pytest.approx(0.850994, abs=1e-6)


def test_proportional_golden() -> None:
    p = make_rope_parameters(head_dim=256, partial_rotary_factor=0.25, rope_theta=1e6, rope_type="proportional")
    inv, _ = inv_freq_and_attention_factor(p)
    assert inv.shape == (128,) and np.count_nonzero(inv) == 32
    assert inv[1] == pytest.approx(0.8976871, abs=1e-7)
    cos, sin, _ = rope_cos_sin(p, 5, offset=1000)
    assert cos.shape == (5, 256) and np.all(cos[:, 32:128] == 1) and np.all(sin[:, 32:128] == 0)


# --- config.json resolution vs the models' own rotary embeddings ----------------------------------------


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
def test_model_configs_match_their_rotary_embedding(name: str) -> None:
    config = MODEL_CONFIGS[name]
    layer_type = "full_attention" if "layer_types" in config else None
    params, info = rope_parameters_from_config(config, layer_type=layer_type)
    module = hf_model_rotary(config)
    max_pos = config["max_position_embeddings"]
    for offset in (0, max_pos - 16):
        positions = np.arange(offset, offset + 16)
        ref_cos, ref_sin = forward_cos_sin(module, positions, layer_type)
        cos, sin, rope_info = rope_cos_sin(params, 16, offset=offset)
        tol = np.concatenate([cos_sin_tolerance(positions, rope_info.inv_freq, rope_info.attention_factor)] * 2, 1)
        assert cos.shape == ref_cos.shape
        assert np.all(np.abs(cos - ref_cos) <= tol) and np.all(np.abs(sin - ref_sin) <= tol)
    assert info["max_position_embeddings"] == max_pos


def test_model_configs_resolved_values() -> None:
    phi3, _ = rope_parameters_from_config(MODEL_CONFIGS["phi-3-mini-128k"])
    assert (phi3.rope_type, phi3.head_dim, phi3.original_max_position_embeddings, phi3.factor) == (
        "longrope", 96, 4096, 32.0)
    deepseek, _ = rope_parameters_from_config(MODEL_CONFIGS["deepseek-v3-yarn"])
    assert (deepseek.rotary_dim, deepseek.factor, deepseek.mscale) == (64, 40.0, 1.0)
    gemma_full, _ = rope_parameters_from_config(MODEL_CONFIGS["gemma-4-proportional"], layer_type="full_attention")
    assert (gemma_full.head_dim, gemma_full.rotary_dim, gemma_full.table_dim) == (512, 128, 512)
    gemma_sliding, _ = rope_parameters_from_config(MODEL_CONFIGS["gemma-4-proportional"],
                                                   layer_type="sliding_attention")
    assert (gemma_sliding.rope_type, gemma_sliding.head_dim, gemma_sliding.rope_theta) == ("default", 256, 1e4)
    v4, _ = rope_parameters_from_config(MODEL_CONFIGS["llama-3.1-8b"])
    v5, _ = rope_parameters_from_config(MODEL_CONFIGS["llama-3.1-8b-v5"])
    assert v4 == v5


def test_top_level_original_overrides_the_dict_only_for_flat_configs() -> None:
    config = {"head_dim": 64, "max_position_embeddings": 32768, "original_max_position_embeddings": 2048,
              "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192}}
    assert rope_parameters_from_config(config)[0].original_max_position_embeddings == 2048
    nested = {"head_dim": 64, "max_position_embeddings": 32768, "original_max_position_embeddings": 2048,
              "layer_types": ["full_attention"], "rope_parameters": {"full_attention": {"rope_type": "yarn",
                                                                                       "factor": 4.0}}}
    assert rope_parameters_from_config(nested, layer_type="full_attention")[0].original_max_position_embeddings \
        == 32768


# --- invalid parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"head_dim": 100, "partial_rotary_factor": 0.25}, "partial_rotary_factor"),  # int(25.0): odd
        ({"head_dim": 65}, "partial_rotary_factor"),
        ({"head_dim": 64, "rotary_dim": 33}, "rotary_dim"),
        ({"head_dim": 64, "rotary_dim": 32, "partial_rotary_factor": 0.5}, "rotary_dim"),
        ({"head_dim": 64, "rope_type": "linear", "factor": 0.5}, "factor"),
        ({"head_dim": 64, "rope_type": "su"}, "rope_type"),
        ({"head_dim": 64, "rope_type": "linear"}, "factor"),
        ({"head_dim": 64, "rope_type": "dynamic", "factor": 2.0}, "max_position_embeddings"),
        ({"head_dim": 64, "rope_type": "yarn"}, "factor, original_max_position_embeddings"),
        ({"head_dim": 64, "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
         "low_freq_factor, high_freq_factor"),
        # low = high puts a wavelength of exactly original / low in the (empty) band: 0 / 0, transformers' NaN
        ({"head_dim": 2, "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 1,
          "low_freq_factor": 1 / (2 * math.pi), "high_freq_factor": 1 / (2 * math.pi)}, "high_freq_factor"),
        ({"head_dim": 8, "rope_type": "longrope", "short_factor": [1, 1], "long_factor": [1, 1, 1, 1],
          "original_max_position_embeddings": 10, "factor": 2.0}, "short_factor"),
        ({"head_dim": 8, "rope_type": "longrope", "short_factor": [1, 1, 1, 1], "long_factor": [1, 1, 1],
          "original_max_position_embeddings": 10, "factor": 2.0}, "long_factor"),
        ({"head_dim": 64, "rope_theta": 1.0}, "rope_theta"),
        ({"head_dim": 64, "rope_type": "proportional", "partial_rotary_factor": 0.5, "rotary_dim": 8}, "rotary_dim"),
    ],
)
def test_invalid_parameters_name_the_parameter(kwargs: dict[str, Any], parameter: str) -> None:
    with pytest.raises(ParameterError) as caught:
        make_rope_parameters(**kwargs)
    assert caught.value.parameter == parameter
    assert str(caught.value).startswith(parameter)


@pytest.mark.parametrize(
    ("config", "parameter"),
    [
        ({"rope_theta": 1e4}, "head_dim"),
        ({"hidden_size": 4096}, "head_dim"),
        ({"head_dim": 64, "rope_scaling": {"type": "linear"}}, "factor"),
        ({"head_dim": 64, "max_position_embeddings": 4096, "rope_parameters": {"rope_type": "yarn"}}, "factor"),
        ({"head_dim": 64, "rope_parameters": {"rope_type": "longrope", "factor": 2.0}},
         "long_factor, original_max_position_embeddings, short_factor"),
        ({"head_dim": 64, "rope_scaling": {"type": "su", "factor": 2.0}}, "rope_type"),
        ({"head_dim": 64, "layer_types": ["a"], "rope_parameters": {"a": {"rope_type": "default"}}}, "layer_type"),
    ],
)
def test_invalid_configs_name_the_key(config: dict[str, Any], parameter: str) -> None:
    with pytest.raises(ParameterError) as caught:
        rope_parameters_from_config(config)
    assert caught.value.parameter == parameter


def test_table_arguments_are_checked() -> None:
    p = make_rope_parameters(head_dim=64)
    for kwargs, parameter in (({"max_position": 0}, "max_position"), ({"max_position": 4, "offset": -1}, "offset"),
                              ({"max_position": 4, "layout": "gptj"}, "layout")):
        with pytest.raises(ParameterError) as caught:
            rope_cos_sin(p, **kwargs)
        assert caught.value.parameter == parameter


@pytest.mark.parametrize(
    ("rope_parameters", "head_dim", "max_pos"),
    [
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "beta_fast": 0,
          "beta_slow": 0}, 128, 16384),  # `or`: zero betas mean the defaults 32 / 1
        ({"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 4096}, 128, 16384),
        ({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096, "attention_factor": 1.5,
          "beta_fast": 16.0, "beta_slow": 2.0}, 96, 32768),
        ({"rope_type": "longrope", "factor": 16.0, "attention_factor": 1.25, "original_max_position_embeddings": 2048,
          "short_factor": [1.0] * 32, "long_factor": [4.0] * 32}, 64, 131072),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
          "original_max_position_embeddings": 8192}, 128, 131072),  # reversed factors: no medium band
        ({"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
          "original_max_position_embeddings": 8192}, 128, 262144),  # Llama 4: equal factors, no medium band
        ({"rope_type": "proportional", "partial_rotary_factor": 1.0, "factor": 4.0}, 128, 8192),
        ({"rope_type": "linear", "partial_rotary_factor": 0.5, "factor": 2.0}, 64, 8192),
        ({"rope_type": "dynamic", "factor": 1.7, "partial_rotary_factor": 0.75}, 80, 3000),
    ],
)
def test_edge_parameters_match_transformers(rope_parameters: dict[str, Any], head_dim: int, max_pos: int) -> None:
    hf = llama_config({"rope_theta": 10000.0, **rope_parameters}, head_dim, max_pos)
    ours = make_rope_parameters(head_dim=head_dim, max_position_embeddings=max_pos, **rope_parameters)
    for seq_len in (None, max_pos // 2, max_pos + 1, 4 * max_pos):
        ref, ref_factor = hf_init(hf, seq_len)
        inv, factor = inv_freq_and_attention_factor(ours, seq_len)
        assert_inv_freq_close(inv, ref)
        assert factor == pytest.approx(ref_factor, rel=1e-15)
    positions = np.arange(4 * max_pos - 16, 4 * max_pos)
    ref_cos, _ = forward_cos_sin(rotary_module(hf), positions)
    cos, _, info = rope_cos_sin(ours, 16, offset=4 * max_pos - 16)
    tol = np.concatenate([cos_sin_tolerance(positions, info.inv_freq, info.attention_factor)] * 2, axis=1)
    assert np.all(np.abs(cos - ref_cos) <= tol)


def test_rope_theta_inside_the_dict_wins_over_top_level() -> None:
    config = {"head_dim": 64, "rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    assert rope_parameters_from_config(config)[0].rope_theta == 5e5
    assert rope_parameters_from_config({"head_dim": 64, "rope_theta": 1e6})[0].rope_theta == 1e6
    assert rope_parameters_from_config({"head_dim": 64})[0].rope_theta == 1e4


def test_multimodal_config_reads_text_config() -> None:
    text = MODEL_CONFIGS["gemma-4-proportional"]
    wrapped = {"model_type": "gemma4", "text_config": text, "vision_config": {"hidden_size": 768}}
    params, info = rope_parameters_from_config(wrapped, layer_type="full_attention")
    assert params == rope_parameters_from_config(text, layer_type="full_attention")[0]
    assert info["config_section"] == "text_config"
