"""Inputs for the shipped RoPE-attention graphs (onnx/<model>/config.json: query, key, value, position_ids)."""

from __future__ import annotations

import numpy as np


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
