"""What each table family contributes to a check: its hypotheses and its precision contract.

An adapter reads the family's own query model (the same parameters the table endpoint validated)
and hands plain values to `posenc.models.diagnosis`. Families are found by query class (subclasses
included); a family without an adapter still gets the agreement figures, the cast-once tolerance
and the reduced-storage hypotheses, so every registered table can be checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from posenc.models.alibi import alibi_bias
from posenc.models.diagnosis.agreement import default_tolerance, ulp
from posenc.models.diagnosis.hypothesis import Hypothesis, Tables, storage_hypotheses
from posenc.models.diagnosis.relative import (
    T5Table,
    alibi_bias_hypotheses,
    alibi_slope_hypotheses,
    negated_hypothesis,
    t5_hypotheses,
)
from posenc.models.diagnosis.rope import RopeTable, rope_hypotheses
from posenc.models.diagnosis.sinusoidal import SinusoidalTable, sinusoidal_hypotheses
from posenc.models.dtypes import np_dtype
from posenc.service.tables.alibi import AlibiBiasQuery, AlibiSlopesQuery
from posenc.service.tables.registry import TableQuery
from posenc.service.tables.relative import ClippedQuery, DebertaBucketsQuery
from posenc.service.tables.rope import RopeTableQuery
from posenc.service.tables.sinusoidal import SinusoidalQuery
from posenc.service.tables.t5 import T5BiasQuery, T5BucketsQuery

Tolerances = dict[str, np.ndarray | float]


@dataclass(frozen=True)
class FamilyCheck:
    """hypotheses(query, reference, observed) and tolerances(query, reference) of one family."""

    hypotheses: Callable[[TableQuery, Callable[[], Tables], Mapping[str, np.ndarray]], list[Hypothesis]]
    tolerances: Callable[[TableQuery, Tables], Tolerances]


def default_tolerances(_: TableQuery, reference: Tables) -> Tolerances:
    return {name: default_tolerance(value) for name, value in reference.items()}


def _generic_hypotheses(query: TableQuery, reference: Callable[[], Tables], _: Mapping[str, np.ndarray]
                        ) -> list[Hypothesis]:
    dtype = getattr(query, "dtype", None)
    return storage_hypotheses(reference, np_dtype(dtype)) if isinstance(dtype, str) and dtype.startswith("f") else []


GENERIC = FamilyCheck(_generic_hypotheses, default_tolerances)


def _rope_table(query: TableQuery) -> RopeTable:
    assert isinstance(query, RopeTableQuery)
    return RopeTable(query.rope, query.rows, query.offset, query.pair_layout, query.form, np_dtype(query.dtype))


def _rope_tolerances(query: TableQuery, reference: Tables) -> Tolerances:
    """docs/ENCODINGS.md precision contract: (2e-6 + 4e-7·|angle|)·max(1, attention factor), at least one
    ulp of the table's dtype; inv_freq within 2 float32 ulp or rtol 3e-7."""
    table = _rope_table(query)
    inv_freq, factor = table.frequencies()
    positions = np.arange(table.offset, table.offset + table.rows, dtype=np.float64)
    angles = np.abs(positions[:, None] * inv_freq.astype(np.float64)[None, :])  # [rows, n_frequencies]
    if table.form == "full":
        angles = np.concatenate([angles, angles], 1) if table.layout == "half" else np.repeat(angles, 2, 1)
    bound = (2e-6 + 4e-7 * angles) * max(1.0, factor)
    out: Tolerances = {name: np.maximum(bound, ulp(reference[name].astype(np.float64), reference[name].dtype))
                       for name in ("cos", "sin")}
    ref_inv = reference["inv_freq"].astype(np.float64)
    out["inv_freq"] = np.maximum(2 * ulp(ref_inv, np.dtype(np.float32)), 3e-7 * np.abs(ref_inv))
    return out


def _rope_hypotheses(query: TableQuery, _: Callable[[], Tables], observed: Mapping[str, np.ndarray]
                     ) -> list[Hypothesis]:
    return rope_hypotheses(_rope_table(query), observed)


def _sinusoidal_table(query: TableQuery) -> SinusoidalTable:
    assert isinstance(query, SinusoidalQuery)
    return SinusoidalTable(query.max_position, query.dim, query.variant, query.base, query.offset,
                           query.padding_idx, np_dtype(query.dtype))


def _sinusoidal_tolerances(query: TableQuery, reference: Tables) -> Tolerances:
    """float32 angles are within it (the angle p·omega, omega <= 1, is good to ~6e-8 relative in float32)."""
    table = _sinusoidal_table(query)
    positions = np.abs(np.arange(table.offset, table.offset + table.rows, dtype=np.float64))[:, None]
    pe = reference["pe"]
    return {"pe": np.maximum(2e-6 + 4e-7 * positions, ulp(pe.astype(np.float64), pe.dtype))}


def _alibi_slope_hypotheses(query: TableQuery, _: Callable[[], Tables], __: Mapping[str, np.ndarray]
                            ) -> list[Hypothesis]:
    assert isinstance(query, AlibiSlopesQuery)
    dtype = np_dtype(query.dtype)
    return alibi_slope_hypotheses(query.num_heads, query.alibi_bias_max, dtype)


def _alibi_bias_hypotheses(query: TableQuery, _: Callable[[], Tables], __: Mapping[str, np.ndarray]
                           ) -> list[Hypothesis]:
    assert isinstance(query, AlibiBiasQuery)

    def reference() -> np.ndarray:
        return alibi_bias(query.num_heads, query.query_length, query.key_length, query.mode, query.mask,
                          query.alibi_bias_max, query.dtype)

    return alibi_bias_hypotheses(reference, query.num_heads, query.alibi_bias_max)


def _t5_hypotheses(query: TableQuery, _: Callable[[], Tables], __: Mapping[str, np.ndarray]) -> list[Hypothesis]:
    assert isinstance(query, (T5BucketsQuery, T5BiasQuery))
    if isinstance(query, T5BiasQuery):
        weight, dtype = query.weight, query.out_dtype()
    else:
        weight, dtype = None, np_dtype(query.dtype)
    return t5_hypotheses(T5Table(query.query_length, query.key_length, query.bidirectional, query.num_buckets,
                                 query.max_distance, query.offset, dtype, weight))


def _deberta_hypotheses(query: TableQuery, reference: Callable[[], Tables], _: Mapping[str, np.ndarray]
                        ) -> list[Hypothesis]:
    # the log bucket is odd in the relative position: negating i − j negates every value
    return [negated_hypothesis("relative_sign", lambda: reference()["relative_positions"], "relative_positions",
                               np.negative, "your relative positions are key − query; DeBERTa's "
                               "build_relative_position uses query − key (the opposite sign)")]


def _clipped_hypotheses(query: TableQuery, reference: Callable[[], Tables], _: Mapping[str, np.ndarray]
                        ) -> list[Hypothesis]:
    assert isinstance(query, ClippedQuery)
    k = query.max_relative_position
    return [negated_hypothesis("relative_sign", lambda: reference()["indices"], "indices",
                               lambda indices: 2 * k - indices, "your indices clip query − key; Shaw et al. "
                               "index the table with clip(key − query, −k, k) + k")]


FAMILY_CHECKS: dict[type[TableQuery], FamilyCheck] = {
    RopeTableQuery: FamilyCheck(_rope_hypotheses, _rope_tolerances),
    SinusoidalQuery: FamilyCheck(lambda q, r, o: sinusoidal_hypotheses(_sinusoidal_table(q), o),
                                 _sinusoidal_tolerances),
    AlibiSlopesQuery: FamilyCheck(lambda q, r, o: _alibi_slope_hypotheses(q, r, o) + _generic_hypotheses(q, r, o),
                                  default_tolerances),
    AlibiBiasQuery: FamilyCheck(lambda q, r, o: _alibi_bias_hypotheses(q, r, o) + _generic_hypotheses(q, r, o),
                                default_tolerances),
    T5BucketsQuery: FamilyCheck(_t5_hypotheses, default_tolerances),
    T5BiasQuery: FamilyCheck(_t5_hypotheses, default_tolerances),
    DebertaBucketsQuery: FamilyCheck(_deberta_hypotheses, default_tolerances),
    ClippedQuery: FamilyCheck(_clipped_hypotheses, default_tolerances),
}


def family_check(query: TableQuery) -> FamilyCheck:
    """The most specific adapter for the query's class, else the generic one."""
    for cls in type(query).__mro__:
        if cls in FAMILY_CHECKS:
            return FAMILY_CHECKS[cls]
    return GENERIC
