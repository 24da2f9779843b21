"""RoPE multi-head attention over given q/k/v: the torch reference of the exported ONNX graphs.

One of the two torch users of the project (with `models/export/exporter.py`). The frequencies and the
attention factor come from `posenc.models.rope.inv_freq_and_attention_factor` — never recomputed here — and
the angles follow transformers 5.23 `LlamaRotaryEmbedding.forward` (docs/ENCODINGS.md §1.3):
`freqs = position_ids.float() * inv_freq` in float32, `cos = cos(freqs) * attention_factor` (same
for sin). The rotation is applied to the first `rotary_dim` channels of q and k (partial rotary
passes the rest through), in the half-split (NeoX, `rotate_half`) or interleaved (GPT-J,
`rotate_every_two`) layout (docs/ENCODINGS.md §2). Attention is `scaled_dot_product_attention` with
scale 1/sqrt(head_dim), causal (upper-left aligned, query i sees keys 0..i) or bidirectional, and
Hq a multiple of Hkv (MHA, GQA, MQA).

longrope switches to its long factors once a batch reaches past original_max_position_embeddings
(`seq_len = max(position_ids) + 1 > L` in transformers' `dynamic_rope_update`). The module holds both
frequency sets and picks one per row from the row's largest position, so a row's result does not
depend on the rows it is batched with (for a batch of one row this is exactly transformers' choice).

Eager mode computes the rotation explicitly (the numeric reference); under `torch.onnx.export`
the same computation is expressed with `torch.onnx.ops.rotary_embedding`, which the exporter emits
as one ONNX `RotaryEmbedding` node, and SDPA becomes one ONNX `Attention` node (opset 23).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from torch import nn

from posenc.models.errors import ParameterError
from posenc.models.rope import RopeParameters, inv_freq_and_attention_factor, inv_freq_switch

Layout = Literal["half", "interleaved"]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Rotate the first `2 * cos.shape[-1]` channels of `x`; pass the others through.

    x: [B, H, S, D]; cos, sin: [B, S, R/2] (R = rotary dim <= D). Returns [B, H, S, D], x's dtype.
    Pair i is channels (i, i + R/2) for `half`, (2i, 2i + 1) for `interleaved`; each pair (x1, x2)
    becomes (x1 cos - x2 sin, x2 cos + x1 sin), which is transformers' `q * cos + rotate_half(q) * sin`
    element by element.
    """
    half = cos.shape[-1]
    rotary, passthrough = x[..., : 2 * half], x[..., 2 * half :]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, S, R/2]: broadcast over heads
    if layout == "half":
        x1, x2 = rotary[..., :half], rotary[..., half:]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)  # [B, H, S, R]
    elif layout == "interleaved":
        pairs = rotary.unflatten(-1, (half, 2))  # [B, H, S, R/2, 2]
        x1, x2 = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)  # [B, H, S, R]
    else:
        raise ParameterError("layout", f"must be 'half' or 'interleaved' (got {layout!r})")
    return torch.cat((rotated, passthrough), dim=-1)


class RopeAttention(nn.Module):
    """RoPE attention: `forward(query, key, value, position_ids) -> output`.

    query [B, Hq, S, D] float32; key, value [B, Hkv, S, D] float32; position_ids [B, S] int64;
    output [B, Hq, S, D] float32. `inv_freq_seq_len` is the `seq_len` handed to
    `inv_freq_and_attention_factor` (frozen at build time; matters only for dynamic / longrope). Left
    None for a type whose frequencies switch once (`inv_freq_switch`: longrope), both sets are kept
    (`inv_freq_sets` [2, R/2]) and each row picks one at run time.
    """

    inv_freq: torch.Tensor
    inv_freq_sets: torch.Tensor | None

    def __init__(
        self,
        rope: RopeParameters,
        num_heads: int,
        num_kv_heads: int,
        *,
        layout: Layout = "half",
        causal: bool = True,
        inv_freq_seq_len: int | None = None,
    ) -> None:
        super().__init__()
        if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ParameterError(
                "num_kv_heads", f"num_heads ({num_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})"
            )
        if layout not in ("half", "interleaved"):
            raise ParameterError("layout", f"must be 'half' or 'interleaved' (got {layout!r})")
        inv_freq, attention_factor = inv_freq_and_attention_factor(rope, inv_freq_seq_len)
        inv_freq = np.asarray(inv_freq, dtype=np.float32)
        if 2 * inv_freq.shape[0] > rope.head_dim:
            raise ParameterError("rotary_dim", f"{2 * inv_freq.shape[0]} rotated channels > head_dim {rope.head_dim}")
        self.rope = rope
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = rope.head_dim
        # Proportional RoPE returns head_dim/2 frequencies (zeros past its angles): the rotated width
        # is what the frequency vector covers, not `rope.rotary_dim`.
        self.rotary_dim = 2 * inv_freq.shape[0]
        self.layout: Layout = layout
        self.causal = causal
        self.attention_factor = float(attention_factor)
        self.scale = 1.0 / math.sqrt(rope.head_dim)
        self.register_buffer("inv_freq", torch.from_numpy(inv_freq.copy()), persistent=False)
        switch = inv_freq_switch(rope) if inv_freq_seq_len is None else None
        # rows whose largest position is >= switch_position (seq_len > L) use the second set
        self.switch_position = switch[0] if switch is not None else None
        sets = np.stack([inv_freq, switch[1]]) if switch is not None else None  # [2, R/2]
        self.register_buffer("inv_freq_sets", None if sets is None else torch.from_numpy(sets), persistent=False)

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [B, S] int64 → cos, sin [B, S, R/2] float32 (attention factor included)."""
        inv_freq = self.inv_freq  # [R/2]
        if self.inv_freq_sets is not None and self.switch_position is not None:
            second = position_ids.amax(dim=1, keepdim=True) >= self.switch_position  # [B, 1] bool
            inv_freq = self.inv_freq_sets[second.to(torch.int64)]  # [B, 1, R/2]: one GatherND node
        freqs = position_ids.unsqueeze(-1).to(torch.float32) * inv_freq  # [B, S, R/2]
        cos, sin = torch.cos(freqs), torch.sin(freqs)
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos, sin

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Apply RoPE to x [B, H, S, D]: explicit math in eager mode, one ONNX node when exporting."""
        if torch.onnx.is_in_onnx_export():
            partial = self.rotary_dim if self.rotary_dim != self.head_dim else 0
            return torch.onnx.ops.rotary_embedding(
                x, cos, sin, interleaved=self.layout == "interleaved", rotary_embedding_dim=partial
            )
        return apply_rope(x, cos, sin, self.layout)

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        cos, sin = self.cos_sin(position_ids)
        query = self.rotate(query, cos, sin)
        key = self.rotate(key, cos, sin)
        return nn.functional.scaled_dot_product_attention(
            query, key, value, is_causal=self.causal, scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
