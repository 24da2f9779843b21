"""Inputs for the shipped RoPE-attention graphs (onnx/<model>/config.json: query, key, value, position_ids), and
config.json documents for the audit."""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc.models.rope_types import DEFAULT_ROPE_TYPE


def attention_inputs(hq: int, hkv: int, head_dim: int, batch: int, seq: int, *, seed: int = 0,
                     start: int = 0) -> dict[str, np.ndarray]:
    """query [B, Hq, S, D], key/value [B, Hkv, S, D] float32 (standard normal, seeded), position_ids [B, S]
    int64: row b holds start + 3·b, start + 3·b + 1, ... (rows differ, so a row mixed up shows)."""
    rng = np.random.default_rng(seed)
    positions = np.arange(seq, dtype=np.int64)[None, :] + start + 3 * np.arange(batch, dtype=np.int64)[:, None]
    return {
        "query": rng.standard_normal((batch, hq, seq, head_dim), dtype=np.float32),
        "key": rng.standard_normal((batch, hkv, seq, head_dim), dtype=np.float32),
        "value": rng.standard_normal((batch, hkv, seq, head_dim), dtype=np.float32),
        "position_ids": positions,
    }


def layered_config(types: int) -> dict[str, Any]:
    """A Gemma-3-style config.json whose `types` layer types each have a RoPE of their own (transformers 5's
    per-layer-type `rope_parameters`, `layer_types` listing them): the audit judges at most MAX_LAYER_TYPES."""
    names = [f"type_{index:05d}" for index in range(types)]
    return {"model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 4, "head_dim": 64,
            "max_position_embeddings": 4096, "layer_types": names,
            "rope_parameters": {name: {"rope_type": DEFAULT_ROPE_TYPE, "rope_theta": 10000.0 + index}
                                for index, name in enumerate(names)}}
