"""Hypotheses of the relative-position families: ALiBi head order (docs/ENCODINGS.md §5.1), T5's
float32 log and direction (§3), DeBERTa's and Shaw's sign convention (§4)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from posenc.models.alibi import alibi_slopes
from posenc.models.diagnosis.hypothesis import Hypothesis, Tables
from posenc.models.dtypes import cast
from posenc.models.relative import key_minus_query, toeplitz
from posenc.models.t5 import t5_bias, t5_buckets, t5_relative_position_bucket


def alibi_head_orders(num_heads: int, alibi_bias_max: float) -> dict[str, tuple[str, np.ndarray]]:
    """Wrong slope orderings as index arrays into the paper's slopes: name → (explanation, permutation).

    Only non-power-of-two head counts have extras to misplace; `reversed` applies to any count > 1.
    """
    out: dict[str, tuple[str, np.ndarray]] = {}
    if num_heads > 1:
        out["head_order_reversed"] = ("your heads are in reverse order (shallowest slope first)",
                                      np.arange(num_heads)[::-1].copy())
    n_pow2 = 1 << (num_heads - 1).bit_length()
    if n_pow2 != num_heads:
        closest = n_pow2 // 2
        extras = num_heads - closest
        # paper order: the closest power of two's block, then the extras; the mistake puts the extras first
        order = np.concatenate([np.arange(closest, num_heads), np.arange(closest)])
        out["head_order_extras_first"] = (
            f"for {num_heads} heads (not a power of two) your {extras} interleaved extra slopes come before the "
            f"{closest}-head block; the paper (and MPT) put the block first", order)
    return out


def alibi_slope_hypotheses(num_heads: int, alibi_bias_max: float, dtype: np.dtype) -> list[Hypothesis]:
    """Slopes in a wrong head order, or the power-of-two formula used for any head count."""
    slopes = alibi_slopes(num_heads, alibi_bias_max)  # float64 [num_heads]
    out = [Hypothesis(name, why, partial(_permuted, "slopes", lambda: cast(slopes, dtype), order))
           for name, (why, order) in alibi_head_orders(num_heads, alibi_bias_max).items()]
    if 1 << (num_heads - 1).bit_length() != num_heads:
        geometric = np.exp2(-np.arange(1, num_heads + 1) * (alibi_bias_max / num_heads))
        out.append(Hypothesis("head_count_formula", f"you used 2^(−{alibi_bias_max:g}k/n) with n = {num_heads}, the "
                              "power-of-two formula; other head counts take the closest power of two's slopes "
                              "plus interleaved extras", lambda: {"slopes": cast(geometric, dtype)}))
    return out


def alibi_bias_hypotheses(reference: Callable[[], np.ndarray], num_heads: int,
                          alibi_bias_max: float) -> list[Hypothesis]:
    """The bias of each wrong head order: the reference's heads permuted (each head depends on its slope only)."""
    return [Hypothesis(name, why, partial(_permuted, "bias", reference, order))
            for name, (why, order) in alibi_head_orders(num_heads, alibi_bias_max).items()]


def _permuted(tensor: str, reference: Callable[[], np.ndarray], order: np.ndarray) -> Tables:
    return {tensor: reference()[order]}


@dataclasses.dataclass(frozen=True)
class T5Table:
    """A T5 bucket (or bias, with `weight` [num_buckets, num_heads]) request."""

    query_length: int
    key_length: int
    bidirectional: bool
    num_buckets: int
    max_distance: int
    offset: int
    dtype: np.dtype
    weight: np.ndarray | None = None

    def _geometry(self) -> dict[str, Any]:
        return {"query_length": self.query_length, "key_length": self.key_length,
                "bidirectional": self.bidirectional, "num_buckets": self.num_buckets,
                "max_distance": self.max_distance, "offset": self.offset}

    def tables(self, buckets: np.ndarray) -> Tables:
        """`buckets` [q, k] as the endpoint's tensor: itself, or the weight gathered to [heads, q, k]."""
        if self.weight is None:
            return {"buckets": buckets.astype(self.dtype)}
        return {"bias": cast(np.moveaxis(self.weight[buckets], -1, 0), self.dtype)}

    def reference(self, **changes: object) -> Tables:
        t = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        if t.weight is None:
            return {"buckets": t5_buckets(**t._geometry()).astype(t.dtype)}
        return {"bias": t5_bias(cast(t.weight, t.dtype), **t._geometry())}


def t5_buckets_float64(relative_position: np.ndarray, bidirectional: bool, num_buckets: int,
                       max_distance: int) -> np.ndarray:
    """T5's bucket function with its log branch in float64 (the common port): int64, same shape."""
    rel = np.asarray(relative_position, dtype=np.int64)
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    upper = np.where(rel > 0, per_direction, 0) if bidirectional else np.zeros_like(rel)
    n = np.abs(rel) if bidirectional else np.maximum(-rel, 0)
    max_exact = per_direction // 2
    ratio = np.maximum(n, max_exact) / max_exact
    scaled = np.log(ratio) / math.log(max_distance / max_exact) * (per_direction - max_exact)
    large = np.minimum(max_exact + scaled.astype(np.int64), per_direction - 1)
    return (upper + np.where(n < max_exact, n, large)).astype(np.int64)


def t5_hypotheses(table: T5Table) -> list[Hypothesis]:
    """float64 log, query − key instead of key − query, the other direction mode, rows shifted by one."""
    offsets = key_minus_query(table.query_length, table.key_length) - table.offset  # key − query per diagonal
    kwargs: dict[str, Any] = {"bidirectional": table.bidirectional, "num_buckets": table.num_buckets,
                              "max_distance": table.max_distance}

    def via(per_offset: np.ndarray) -> Tables:
        return table.tables(toeplitz(per_offset, table.query_length, table.key_length))

    out = [
        Hypothesis("t5_float64_log", "your bucket log is computed in float64; T5 computes it in float32, which moves "
                   "some bucket boundaries", lambda: via(t5_buckets_float64(offsets, **kwargs))),
        Hypothesis("relative_sign", "your relative positions are query − key; T5 buckets key − query "
                   "(memory_position − context_position)",
                   lambda: via(t5_relative_position_bucket(-offsets, **kwargs))),
        Hypothesis("bidirectional", f"you used bidirectional={str(not table.bidirectional).lower()} (the "
                   f"{'decoder' if table.bidirectional else 'encoder'}'s buckets)",
                   lambda: table.reference(bidirectional=not table.bidirectional)),
        Hypothesis("offset_+1", f"your query positions start at {table.offset + 1} instead of {table.offset}",
                   lambda: table.reference(offset=table.offset + 1)),
    ]
    if table.offset > 0:
        out.append(Hypothesis("offset_-1", f"your query positions start at {table.offset - 1} instead of "
                              f"{table.offset}", lambda: table.reference(offset=table.offset - 1)))
    return out


def negated_hypothesis(name: str, reference: Callable[[], np.ndarray], tensor: str, transform: Callable[
        [np.ndarray], np.ndarray], explanation: str) -> Hypothesis:
    """A sign-convention mistake: the reference's relative positions negated, expressed on its values."""
    return Hypothesis(name, explanation, lambda: {tensor: transform(reference())})
