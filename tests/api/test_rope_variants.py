"""RoPE variants of inference engines (no transformers rope_type): `ntk_alpha` (vLLM DynamicNTKAlphaRotaryEmbedding,
HunYuan) and `deepseek_yarn` (vLLM DeepseekScalingRotaryEmbedding's mscale), against formulas written out here
from the sources (docs/ENCODINGS.md §14); ntk_alpha also against transformers' HunYuan rotary module.
"""

import json
import math
from typing import Any

import numpy as np
import pytest

from posenc.models.errors import ParameterError
from posenc.models.rope import inv_freq_and_attention_factor, make_rope_parameters, rope_cos_sin

FORMULA_RTOL = 4e-7  # float32 inv_freq (posenc, as the engines) against the float64 formula


def ntk_alpha_formula(theta: float, alpha: float, d: int) -> np.ndarray:
    """base' = theta · alpha^(d/(d−2)); inv_freq_i = base'^(−2i/d)."""
    base = theta * alpha ** (d / (d - 2))
    return np.array([base ** (-2 * i / d) for i in range(d // 2)])


def mscale(scale: float, m: float) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def yarn_formula(theta: float, d: int, s: float, original: int, beta_fast: float = 32,
                 beta_slow: float = 1) -> np.ndarray:
    """YaRN (Peng et al. 2023, §3.2 'NTK-by-parts'), as vLLM's `_compute_inv_freq`: the first pairs (many
    rotations in the original context) extrapolate, the last interpolate by s, a linear ramp between."""
    def correction_dim(rotations: float) -> float:
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low: float = max(math.floor(correction_dim(beta_fast)), 0)
    high: float = min(math.ceil(correction_dim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    out = []
    for i in range(d // 2):
        extrapolation = theta ** (-2 * i / d)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(extrapolation / s * ramp + extrapolation * (1 - ramp))
    return np.array(out)


@pytest.mark.parametrize(("theta", "alpha", "d"), [(10000.0, 1000.0, 128), (1e6, 2.0, 64), (5e5, 1.0, 16),
                                                   (10000.0, 50.0, 4)])
def test_ntk_alpha_formula(theta: float, alpha: float, d: int) -> None:
    p = make_rope_parameters(head_dim=d, rope_theta=theta, rope_type="ntk_alpha", alpha=alpha)
    inv_freq, attention_factor = inv_freq_and_attention_factor(p, 10**6)
    assert inv_freq.dtype == np.float32 and attention_factor == 1.0
    np.testing.assert_allclose(inv_freq, ntk_alpha_formula(theta, alpha, d), rtol=FORMULA_RTOL, atol=0)
    # static: the sequence length does not matter (unlike dynamic)
    np.testing.assert_array_equal(inv_freq, inv_freq_and_attention_factor(p, None)[0])


@pytest.mark.parametrize(("kwargs", "field"), [
    ({}, "alpha"), ({"alpha": 0.5}, "alpha"), ({"alpha": 4.0, "head_dim": 2}, "rotary_dim"),
])
def test_ntk_alpha_bad_parameters(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ParameterError) as info:
        make_rope_parameters(**{"head_dim": 64, "rope_type": "ntk_alpha", **kwargs})
    assert field in info.value.parameter


# (mscale, mscale_all_dim, attention_factor) → the expected factor for s = 40, written out
S = 40.0
DEEPSEEK_CASES = [
    (None, None, None, mscale(S, 1.0)),  # vLLM defaults: mscale 1, mscale_all_dim 0
    (1.0, 1.0, None, 1.0),  # DeepSeek-V3's config
    (0.707, 0.707, None, 1.0),  # DeepSeek-V2's config
    (0.707, None, None, 0.1 * 0.707 * math.log(S) + 1.0),  # transformers' yarn: 0.1 ln s + 1
    (None, 0.707, None, (0.1 * math.log(S) + 1.0) / (0.1 * 0.707 * math.log(S) + 1.0)),  # transformers: 0.1 ln s + 1
    (1.0, 1.0, 2.0, 2.0),  # attn_factor multiplies (transformers' attention_factor replaces)
    (0.5, 0.0, 1.5, 1.5 * (0.05 * math.log(S) + 1.0)),
]


@pytest.mark.parametrize(("m", "m_all", "attn", "expected"), DEEPSEEK_CASES)
def test_deepseek_yarn_attention_factor(m: float | None, m_all: float | None, attn: float | None,
                                        expected: float) -> None:
    p = make_rope_parameters(head_dim=64, rope_theta=10000.0, rope_type="deepseek_yarn", factor=S,
                             original_max_position_embeddings=4096, mscale=m, mscale_all_dim=m_all,
                             attention_factor=attn)
    inv_freq, factor = inv_freq_and_attention_factor(p)
    assert factor == pytest.approx(expected, rel=1e-15)
    np.testing.assert_allclose(inv_freq, yarn_formula(10000.0, 64, S, 4096), rtol=FORMULA_RTOL, atol=0)


def test_deepseek_yarn_differs_from_transformers_yarn_only_in_mscale() -> None:
    common = {"head_dim": 64, "rope_theta": 10000.0, "factor": S, "original_max_position_embeddings": 4096,
              "mscale": 0.707}
    deepseek = make_rope_parameters(rope_type="deepseek_yarn", **common)
    yarn = make_rope_parameters(rope_type="yarn", **common)
    ds_freq, ds_factor = inv_freq_and_attention_factor(deepseek)
    yarn_freq, yarn_factor = inv_freq_and_attention_factor(yarn)
    np.testing.assert_array_equal(ds_freq, yarn_freq)
    assert yarn_factor == pytest.approx(mscale(S, 1.0)) and ds_factor == pytest.approx(mscale(S, 0.707))


def test_deepseek_yarn_cos_sin() -> None:
    p = make_rope_parameters(head_dim=32, rope_theta=10000.0, rope_type="deepseek_yarn", factor=4.0,
                             original_max_position_embeddings=2048, mscale=0.707, attention_factor=1.25)
    cos, sin, info = rope_cos_sin(p, 64, offset=100, dtype="float64")
    positions = np.arange(100, 164, dtype=np.float64)[:, None]
    expected = 1.25 * mscale(4.0, 0.707)
    angles = positions * yarn_formula(10000.0, 32, 4.0, 2048)[None, :]
    np.testing.assert_allclose(cos[:, :16], expected * np.cos(angles), rtol=0, atol=4e-7 * 164)
    np.testing.assert_allclose(sin[:, 16:], expected * np.sin(angles), rtol=0, atol=4e-7 * 164)
    assert info.attention_factor == pytest.approx(expected)


def test_routes(client: Any) -> None:
    # the API spells the variants as checkpoints and vLLM do: dynamic + alpha, yarn + the DeepSeek mscale
    r = client.get("/v1/rope?head_dim=64&max_position=8&rope_type=dynamic&alpha=1000&format=json&tensor=inv_freq")
    assert r.status_code == 200, r.text
    body = r.json()
    np.testing.assert_allclose(body["tensors"]["inv_freq"]["data"], ntk_alpha_formula(10000.0, 1000.0, 64),
                               rtol=FORMULA_RTOL)
    assert body["metadata"]["alpha"] == "1000.0" and body["metadata"]["rope_type"] == "ntk_alpha"
    internal = client.get("/v1/rope?head_dim=64&max_position=8&rope_type=ntk_alpha")
    assert internal.status_code == 422 and "rope_type" in internal.json()["error"]
    low = client.get("/v1/rope?head_dim=64&max_position=8&rope_type=dynamic&alpha=0.5")
    assert low.status_code == 422 and "alpha" in low.json()["error"]
    ds = client.get("/v1/rope?head_dim=64&max_position=8&rope_type=yarn&yarn_mscale=deepseek&factor=40"
                    "&original_max_position_embeddings=4096&mscale=0.707")
    assert ds.status_code == 200, ds.text
    header = json.loads(ds.content[8:8 + int.from_bytes(ds.content[:8], "little")])["__metadata__"]
    assert float(header["attention_factor"]) == pytest.approx(mscale(S, 0.707))
    assert header["rope_type"] == "deepseek_yarn"
    # the yarn cache key is unchanged by mscale's "not given" spelling
    plain = client.get("/v1/rope?head_dim=64&max_position=8&rope_type=yarn&factor=4&original_max_position_embeddings=8")
    zero = client.get("/v1/rope?head_dim=64&max_position=8&rope_type=yarn&factor=4&original_max_position_embeddings=8"
                      "&mscale=0")
    assert plain.headers["ETag"] == zero.headers["ETag"]
