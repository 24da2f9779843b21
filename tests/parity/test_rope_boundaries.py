"""Edge values of the RoPE parameter resolution that the grid tests never hit.

- llama3: a float32 wavelength exactly on `low_freq_wavelen` or `high_freq_wavelen` (transformers compares
  with strict `>` / `<`, so such a frequency is smoothed, and its float32 value differs by a few ulp from the
  one a `>=` / `<=` would give: only a bit-for-bit comparison sees it).
- partial rotary: transformers truncates `head_dim * partial_rotary_factor` with `int()`; 100 * 0.29 is
  28.999999999999996, so it rotates 28 channels (rounding would give 29, an odd and refused dim).
"""

import math
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.numpy import load as safetensors_load
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding

from posenc.models.rope import inv_freq_and_attention_factor, make_rope_parameters
from tests.rope_reference import assert_inv_freq_close, llama_config

# (rope_theta, head_dim, llama3 parameters, which boundary, index of the frequency that lies on it).
# Found by a numerical search: the wavelength 2π / inv_freq[index] (float32, as transformers computes it)
# equals float32(original / low_freq_factor) resp. float32(original / high_freq_factor) exactly, and the
# smoothing there does not reduce to the value of the neighbouring branch in float32.
LLAMA3_BOUNDARY_CASES = [
    pytest.param(1e7, 128, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 5063256}, "low", 54, id="low_freq_wavelen"),
    pytest.param(5e5, 128, {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 5533810}, "high", 60, id="high_freq_wavelen"),
]


def _transformers_wavelengths(theta: float, head_dim: int) -> np.ndarray:
    """`2 * math.pi / inv_freq` exactly as `_compute_llama3_parameters` computes it (float32 torch)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    return (2 * math.pi / inv_freq).numpy()


@pytest.mark.parametrize(("theta", "head_dim", "scaling", "boundary", "index"), LLAMA3_BOUNDARY_CASES)
def test_llama3_frequency_on_a_smoothing_boundary_matches_transformers_bit_for_bit(
    theta: float, head_dim: int, scaling: dict[str, Any], boundary: str, index: int
) -> None:
    """Guards the strict comparisons `wavelen > low_freq_wavelen` / `wavelen < high_freq_wavelen` of
    `_llama3`: written `>=` / `<=`, the frequency on the boundary skips the smoothing and is off by 1-3 ulp."""
    original = scaling["original_max_position_embeddings"]
    edge = np.float32(original / scaling[f"{boundary}_freq_factor"])
    wavelengths = _transformers_wavelengths(theta, head_dim)
    assert wavelengths[index] == edge, "the case no longer puts a frequency on the boundary"

    hf = llama_config({"rope_type": "llama3", "rope_theta": theta, **scaling}, head_dim, original)
    ref = ROPE_INIT_FUNCTIONS["llama3"](hf, None)[0].numpy()
    ours, attention_factor = inv_freq_and_attention_factor(
        make_rope_parameters(head_dim=head_dim, rope_theta=theta, rope_type="llama3", **scaling)
    )
    assert attention_factor == 1.0 and ours.dtype == np.float32 and ours.shape == ref.shape
    assert ours[index].view(np.int32) == ref[index].view(np.int32), (ours[index], ref[index])
    np.testing.assert_array_equal(ours.view(np.int32), ref.view(np.int32))


def test_partial_rotary_factor_truncates_like_transformers() -> None:
    """Guards `int(head_dim * partial_rotary_factor)`: `round()` would give 29 (odd, refused) for 100 * 0.29."""
    params = make_rope_parameters(head_dim=100, partial_rotary_factor=0.29)
    assert params.rotary_dim == 28 and params.table_dim == 28 and params.n_frequencies == 14


@pytest.mark.parametrize(("rope_type", "extras"), [("default", {}), ("linear", {"factor": 2.0})])
def test_truncated_rotary_dim_inv_freq_matches_transformers(rope_type: str, extras: dict[str, Any]) -> None:
    """inv_freq for head_dim 100, partial_rotary_factor 0.29: 14 frequencies with exponents 2i / 28."""
    hf = llama_config({"rope_type": rope_type, "rope_theta": 10000.0, "partial_rotary_factor": 0.29, **extras},
                      100, 4096)
    if rope_type == "default":  # GPT-NeoX's default init honours partial_rotary_factor (Llama's ignores it)
        ref = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(hf)[0].numpy()
    else:
        ref = ROPE_INIT_FUNCTIONS[rope_type](hf, None)[0].numpy()
    ours, _ = inv_freq_and_attention_factor(
        make_rope_parameters(head_dim=100, partial_rotary_factor=0.29, rope_type=rope_type, **extras)
    )
    assert ref.shape == (14,)
    assert_inv_freq_close(ours, ref)


def test_truncated_rotary_dim_through_http(client: TestClient) -> None:
    """GET /v1/rope with head_dim=100&partial_rotary_factor=0.29 answers 28-channel cos/sin, not a 422."""
    r = client.get("/v1/rope?max_position=2&head_dim=100&partial_rotary_factor=0.29")
    assert r.status_code == 200, r.text
    tensors = safetensors_load(r.content)
    assert tensors["cos"].shape == (2, 28) and tensors["sin"].shape == (2, 28)
    assert tensors["inv_freq"].shape == (14,)
    np.testing.assert_array_equal(tensors["cos"][0], np.ones(28, dtype=np.float32))
