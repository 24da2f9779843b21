"""A numpy RoPE attention, parametrised by the known porting mistakes of attention code.

The reference follows `posenc.models.export.rope_attention.RopeAttention` (the torch module the ONNX graphs are
exported from): angles `position_ids.float() * inv_freq` in float32, cos/sin times the attention
factor, the rotation of the first `rotary_dim` channels of q and k (half or interleaved layout),
scores `q·kᵀ · scale` with scale 1/√head_dim, causal upper-left mask, GQA by repeating each kv head
over a contiguous group of query heads. A longrope model's rows whose largest position reaches
`switch_position` use the switched (long-factor) frequencies, as the graph does. The rest runs in
float64 and the result is cast to float32.

Mistakes (each a keyword of `attention`): `causal=False` (mask missing), `scale=1/D`, `gqa="tile"`
(kv head h mod Hkv instead of h // group), `rope_on_value=True`, `positions_given=False` (positions
0..S−1 instead of the given ids).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from posenc.models.diagnosis.hypothesis import Hypothesis

F32 = np.float32
# numpy float64 against onnxruntime float32 (softmax over S keys, sums over D channels): docs/ENCODINGS.md §11
ATTENTION_ATOL = 5e-5
ATTENTION_RTOL = 5e-5


@dataclass(frozen=True)
class AttentionSpec:
    """What a RoPE-attention model computes, from its repository config.json (`attention` and `rope`)."""

    inv_freq: np.ndarray  # float32 [R/2]
    attention_factor: float
    layout: Literal["half", "interleaved"]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool
    scale: float
    switch_position: int | None = None
    inv_freq_switched: np.ndarray | None = None  # float32 [R/2]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> AttentionSpec | None:
        """None when the config does not describe a RoPE attention (no `attention` or `rope` section)."""
        attention, rope = config.get("attention"), config.get("rope")
        if not isinstance(attention, Mapping) or not isinstance(rope, Mapping) or "inv_freq" not in rope:
            return None
        switched = rope.get("inv_freq_switched")
        return cls(np.asarray(rope["inv_freq"], dtype=F32), float(rope.get("attention_factor_resolved") or 1.0),
                   rope.get("layout", "half"), int(attention["num_heads"]), int(attention["num_kv_heads"]),
                   int(attention["head_dim"]), bool(attention["causal"]), float(attention["scale"]),
                   int(rope["switch_position"]) if switched is not None else None,
                   np.asarray(switched, dtype=F32) if switched is not None else None)

    def row_inv_freq(self, positions: np.ndarray) -> np.ndarray:
        """positions [B, S] → float32 [B, 1, R/2]: each row's frequencies (the switched set from its largest
        position on, where the model switches)."""
        rows = np.broadcast_to(self.inv_freq, (positions.shape[0], 1, self.inv_freq.shape[0]))
        if self.switch_position is None or self.inv_freq_switched is None:
            return rows
        switched = positions.max(axis=-1) >= self.switch_position  # [B]
        return np.where(switched[:, None, None], self.inv_freq_switched, rows)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, layout: str) -> np.ndarray:
    """x [B, H, S, D] float64; cos, sin [B, S, R/2]: the first R channels rotated, the rest passed through."""
    half = cos.shape[-1]
    cos, sin = cos[:, None], sin[:, None]  # [B, 1, S, R/2]
    out = x.copy()
    if layout == "half":
        x1, x2 = x[..., :half], x[..., half:2 * half]
        out[..., :half], out[..., half:2 * half] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out


def attention(spec: AttentionSpec, query: np.ndarray, key: np.ndarray, value: np.ndarray, position_ids: np.ndarray,
              *, causal: bool | None = None, scale: float | None = None, gqa: Literal["repeat", "tile"] = "repeat",
              rope_on_value: bool = False, positions_given: bool = True) -> np.ndarray:
    """query [B, Hq, S, D], key/value [B, Hkv, S, D], position_ids [B, S] → output float32 [B, Hq, S, D]."""
    batch, heads, seq, _ = query.shape
    positions = position_ids if positions_given else np.broadcast_to(np.arange(seq), (batch, seq))
    freqs = positions.astype(F32)[..., None] * spec.row_inv_freq(positions)  # float32 [B, S, R/2], as the model
    cos = np.cos(freqs.astype(np.float64)) * spec.attention_factor
    sin = np.sin(freqs.astype(np.float64)) * spec.attention_factor
    q = _rotate(query.astype(np.float64), cos, sin, spec.layout)
    k = _rotate(key.astype(np.float64), cos, sin, spec.layout)
    v = _rotate(value.astype(np.float64), cos, sin, spec.layout) if rope_on_value else value.astype(np.float64)
    group = heads // key.shape[1]
    kv_head = np.arange(heads) // group if gqa == "repeat" else np.arange(heads) % key.shape[1]
    k, v = k[:, kv_head], v[:, kv_head]  # [B, Hq, S, D]
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) * (spec.scale if scale is None else scale)
    if spec.causal if causal is None else causal:
        scores = np.where(np.tril(np.ones((seq, seq), dtype=bool)), scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", weights, v).astype(F32)


def attention_tolerance(reference: np.ndarray) -> np.ndarray:
    return ATTENTION_ATOL + ATTENTION_RTOL * np.abs(reference.astype(np.float64))


def attention_hypotheses(spec: AttentionSpec, inputs: Mapping[str, np.ndarray]) -> list[Hypothesis]:
    """The attention mistakes that apply to this model and these inputs; each builds {"output": ...}."""
    q, k, v, pos = inputs["query"], inputs["key"], inputs["value"], inputs["position_ids"]

    def build(**mistake: Any) -> Any:
        return lambda: {"output": attention(spec, q, k, v, pos, **mistake)}

    out = []
    if spec.causal:
        out.append(Hypothesis("causal_mask_missing", "your attention has no causal mask: queries see later keys",
                              build(causal=False)))
    if not math.isclose(spec.scale, 1.0 / spec.head_dim):
        out.append(Hypothesis("scale_1_over_d", f"your scores are scaled by 1/D = 1/{spec.head_dim}; the model uses "
                              f"1/√D = {spec.scale:.6g}", build(scale=1.0 / spec.head_dim)))
    # one kv head (MQA): every query head reads it, tiled or repeated alike, so the mistake cannot happen
    if 1 < spec.num_kv_heads < spec.num_heads:
        group = spec.num_heads // spec.num_kv_heads
        out.append(Hypothesis("gqa_grouping", f"your query head h reads kv head h mod {spec.num_kv_heads} (tiled); the "
                              f"model repeats each kv head over {group} consecutive query heads (h // {group})",
                              build(gqa="tile")))
    out.append(Hypothesis("rope_on_value", "you rotated v as well; RoPE applies to q and k only",
                          build(rope_on_value=True)))
    # RoPE scores depend on position differences only: ids that are a run start..start+S−1 give the same output
    # as 0..S−1, so only ids with gaps (packed sequences, padding) can show this mistake
    if not np.all(np.diff(pos, axis=-1) == 1):
        out.append(Hypothesis("positions_not_passed", "your rotation used positions 0..S−1, not the given "
                              "position_ids", build(positions_given=False)))
    return out
