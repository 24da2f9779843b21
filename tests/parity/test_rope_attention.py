"""The torch reference module: RoPE equals transformers' on the same inputs; attention equals a naive one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_apply
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply

from posenc.models.errors import ParameterError
from posenc.models.export.rope_attention import RopeAttention, apply_rope
from posenc.models.rope import make_rope_parameters

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def _module(head_dim: int = 16, hq: int = 4, hkv: int = 2, *, prf: float = 1.0, layout: str = "half",
            causal: bool = True, theta: float = 10000.0, scaling: dict | None = None) -> RopeAttention:
    rope = make_rope_parameters(head_dim=head_dim, rope_theta=theta, partial_rotary_factor=prf, **(scaling or {}))
    return RopeAttention(rope, hq, hkv, layout=layout, causal=causal)  # type: ignore[arg-type]


def _positions(batch: int, seq: int, start: int = 0) -> torch.Tensor:
    return (torch.arange(seq) + start).repeat(batch, 1) + torch.arange(batch)[:, None] * 7  # [B, S]


@pytest.mark.parametrize(("theta", "scaling", "start"), [
    (10000.0, None, 0), (500000.0, LLAMA3, 0), (500000.0, LLAMA3, 20000),
    (10000.0, {"rope_type": "linear", "factor": 4.0}, 300),
    (10000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}, 5000),
])
def test_cos_sin_equal_llama_rotary_embedding(theta: float, scaling: dict | None, start: int) -> None:
    head_dim = 64
    module = _module(head_dim, theta=theta, scaling={**(scaling or {}), "max_position_embeddings": 8192})
    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                         max_position_embeddings=8192,
                         rope_parameters={"rope_theta": theta, **(scaling or {"rope_type": "default"})})
    reference = LlamaRotaryEmbedding(config)
    positions = _positions(2, 9, start)
    x = torch.zeros(2, 9, head_dim)
    ref_cos, ref_sin = reference(x, positions)  # [B, S, D] = cat(freqs, freqs)
    cos, sin = module.cos_sin(positions)  # [B, S, D/2]
    np.testing.assert_allclose(module.inv_freq.numpy(), reference.inv_freq.numpy(), rtol=3e-7)
    # Angles are position * inv_freq in float32 on both sides; allow the contract's angle term.
    tol = (2e-6 + 4e-7 * float(positions.max()) * float(module.inv_freq.max())) * max(1.0, module.attention_factor)
    torch.testing.assert_close(torch.cat((cos, cos), -1), ref_cos, atol=tol, rtol=0)
    torch.testing.assert_close(torch.cat((sin, sin), -1), ref_sin, atol=tol, rtol=0)


@pytest.mark.parametrize(("batch", "heads", "seq", "head_dim"), [(1, 1, 1, 8), (2, 4, 5, 16), (3, 2, 17, 64)])
def test_half_layout_equals_transformers_apply_rotary_pos_emb(batch: int, heads: int, seq: int, head_dim: int) -> None:
    module = _module(head_dim, heads, heads)
    q, k = torch.randn(batch, heads, seq, head_dim), torch.randn(batch, heads, seq, head_dim)
    cos, sin = module.cos_sin(_positions(batch, seq))
    ref_q, ref_k = llama_apply(q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    torch.testing.assert_close(apply_rope(q, cos, sin, "half"), ref_q, atol=0, rtol=0)
    torch.testing.assert_close(apply_rope(k, cos, sin, "half"), ref_k, atol=0, rtol=0)


@pytest.mark.parametrize(("head_dim", "prf"), [(16, 0.5), (32, 0.25), (20, 0.4)])
def test_partial_rotary_equals_gpt_neox(head_dim: int, prf: float) -> None:
    module = _module(head_dim, 2, 2, prf=prf)
    assert module.rotary_dim == int(head_dim * prf)
    q, k = torch.randn(2, 2, 6, head_dim), torch.randn(2, 2, 6, head_dim)
    cos, sin = module.cos_sin(_positions(2, 6, 3))
    ref_q, _ = neox_apply(q, k, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    torch.testing.assert_close(apply_rope(q, cos, sin, "half"), ref_q, atol=0, rtol=0)
    torch.testing.assert_close(apply_rope(q, cos, sin, "half")[..., module.rotary_dim:], q[..., module.rotary_dim:])


@pytest.mark.parametrize("prf", [1.0, 0.5])
def test_interleaved_layout_equals_gptj(prf: float) -> None:
    head_dim = 16
    module = _module(head_dim, 3, 3, prf=prf, layout="interleaved")
    rd = module.rotary_dim
    x = torch.randn(2, 3, 5, head_dim)
    cos, sin = module.cos_sin(_positions(2, 5, 11))
    # GPT-J works on [B, S, H, D] and rotates x[..., :rotary_dim] with repeat_interleave'd cos/sin.
    rotated = gptj_apply(x.transpose(1, 2)[..., :rd], sin, cos).transpose(1, 2)
    expected = torch.cat((rotated, x[..., rd:]), -1)
    torch.testing.assert_close(apply_rope(x, cos, sin, "interleaved"), expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("prf", [1.0, 0.5])
def test_explicit_rotation_equals_onnx_rotary_embedding_eager(layout: str, prf: float) -> None:
    module = _module(16, 2, 2, prf=prf, layout=layout)
    x = torch.randn(2, 2, 7, 16)
    cos, sin = module.cos_sin(_positions(2, 7))
    partial = module.rotary_dim if module.rotary_dim != 16 else 0
    fused = torch.onnx.ops.rotary_embedding(x, cos, sin, interleaved=layout == "interleaved",
                                            rotary_embedding_dim=partial)
    torch.testing.assert_close(apply_rope(x, cos, sin, layout), fused, atol=1e-6, rtol=1e-6)  # type: ignore[arg-type]


def _naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # [B, Hq, S, D]
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, Hq, S, S]
    if causal:
        seq = q.shape[2]
        scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v.double()).float()


@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (4, 1), (6, 3)])
@pytest.mark.parametrize("causal", [True, False])
def test_module_equals_rotate_then_naive_attention(hq: int, hkv: int, causal: bool) -> None:
    module = _module(16, hq, hkv, causal=causal, theta=500000.0, scaling=LLAMA3)
    q, k, v = torch.randn(2, hq, 6, 16), torch.randn(2, hkv, 6, 16), torch.randn(2, hkv, 6, 16)
    positions = _positions(2, 6, 100)
    with torch.no_grad():
        out = module(q, k, v, positions)
    cos, sin = module.cos_sin(positions)
    expected = _naive_attention(apply_rope(q, cos, sin, "half"), apply_rope(k, cos, sin, "half"), v, causal)
    assert out.shape == (2, hq, 6, 16)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_causal_first_row_sees_only_itself() -> None:
    module = _module(8, 2, 2, causal=True)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    with torch.no_grad():
        out = module(q, k, v, _positions(1, 4))
    torch.testing.assert_close(out[:, :, 0], v[:, :, 0])


def test_invalid_geometry_is_refused() -> None:
    rope = make_rope_parameters(head_dim=16)
    with pytest.raises(ParameterError, match="multiple"):
        RopeAttention(rope, 4, 3)
    with pytest.raises(ParameterError, match="layout"):
        RopeAttention(rope, 4, 4, layout="diagonal")  # type: ignore[arg-type]
