"""How much memory one onnxruntime run of an attention model takes, and how much a run may take.

onnxruntime's Attention materialises the scores and their softmax, each [B, Hq, S, S] float32: one
llama3_1 row at S=8192 asks for 2·4·32·8192² = 17,179,869,184 bytes. That term dominates every other
buffer of the graph (inputs and outputs are [B, H, S, D] with D ≪ S), so it is the bound: a request
whose single row exceeds `max_run_bytes` is refused with 413 before anything runs, and batches and
concurrent runs together stay under it (they queue instead).

The default limit follows the provider: a quarter of the device memory on CUDA (onnxruntime's arena
is capped at three quarters, so several runs' peaks and the arena's rounding still fit), a quarter of
the memory this process may use on CPU (the cgroup limit when there is one).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from posenc.service.inference.runtime.devices import cuda_memory_bytes, process_memory_bytes

log = logging.getLogger("posenc.inference.run_bound")

SCORE_COPIES = 2  # scores and softmax probabilities, both alive inside one Attention node
SCORE_BYTES = 4  # float32: onnxruntime's Attention computes in float32 for float32 inputs
RUN_SHARE = 4  # a run may take 1/RUN_SHARE of the memory (device or RAM)
ARENA_SHARE = 0.75  # onnxruntime's CUDA arena may grow to this share of the device memory


@dataclass(frozen=True)
class AttentionCost:
    """Memory of one run of an attention model with `heads` query heads."""

    heads: int

    def run_bytes(self, rows: int, seq: int) -> int:
        """Bytes of the [rows, heads, seq, seq] float32 scores and probabilities."""
        return SCORE_COPIES * SCORE_BYTES * rows * self.heads * seq * seq

    def largest_seq(self, limit: int) -> int:
        """The longest sequence one row may have under `limit` bytes."""
        return math.isqrt(max(0, limit) // (SCORE_COPIES * SCORE_BYTES * self.heads))

    def largest_rows(self, seq: int, limit: int) -> int:
        """How many rows of length `seq` one run may hold under `limit` bytes (0: not even one)."""
        return limit // self.run_bytes(1, seq)


def attention_cost(config: dict[str, Any] | Any) -> AttentionCost | None:
    """The cost model of a repository model from its config.json `attention` entry (None: not an attention
    model posenc exported, no bound)."""
    attention = config.get("attention") if hasattr(config, "get") else None
    heads = attention.get("num_heads") if isinstance(attention, dict) else None
    return AttentionCost(heads) if isinstance(heads, int) and heads > 0 else None


def default_run_bytes(on_cuda: bool) -> int:
    """The limit when POSENC_MAX_RUN_BYTES is 0: a share of the device's memory, or of this process's RAM."""
    if on_cuda:
        device = cuda_memory_bytes()
        if device is not None:
            return device // RUN_SHARE
        log.warning("CUDA device memory unknown (no CUDA runtime library found); bounding runs by RAM instead")
    return process_memory_bytes() // RUN_SHARE


def cuda_arena_limit() -> int | None:
    """Cap of onnxruntime's CUDA arena (`gpu_mem_limit`), None when the device memory is unknown."""
    device = cuda_memory_bytes()
    return int(device * ARENA_SHARE) if device is not None else None
