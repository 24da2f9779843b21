"""Sinusoidal hypotheses (docs/ENCODINGS.md §6): rows shifted, fairseq's padding offset, another
variant's layout or spacing, sin and cos exchanged, float32 angles, reduced storage."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from functools import partial
from typing import get_args

import numpy as np

from posenc.models.diagnosis.hypothesis import Hypothesis, Tables, storage_hypotheses
from posenc.models.dtypes import cast
from posenc.models.sinusoidal import SinusoidalVariant, log_spaced_frequencies, paper_frequencies, sinusoidal_table

F32 = np.float32


@dataclasses.dataclass(frozen=True)
class SinusoidalTable:
    """The parameters of a `GET /v1/sinusoidal` request (dtype as a numpy dtype)."""

    rows: int
    dim: int
    variant: SinusoidalVariant
    base: float
    offset: int
    padding_idx: int
    dtype: np.dtype

    def table(self, **changes: object) -> Tables:
        t = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        return {"pe": sinusoidal_table(t.rows, t.dim, t.variant, t.base, t.offset, t.padding_idx, t.dtype)}


def _swapped(table: SinusoidalTable) -> Tables:
    """sin where cos belongs and back: pairs exchanged (paper) or halves exchanged ([sin | cos] variants)."""
    pe = table.table()["pe"]
    half = table.dim // 2
    if table.variant == "paper":
        out = pe.copy()
        out[:, 0::2], out[:, 1::2] = pe[:, 1::2], pe[:, 0::2]
        return {"pe": out}
    return {"pe": np.concatenate([pe[:, half:], pe[:, :half]], axis=1)}


def _float32_angles(table: SinusoidalTable) -> Tables:
    """The reference's frequencies, but position × omega (and sin/cos) in float32."""
    positions = np.arange(table.offset, table.offset + table.rows, dtype=F32)[:, None]
    if table.variant in ("paper", "marian"):
        omega = paper_frequencies(table.dim // 2, table.dim, table.base).astype(F32)
    else:
        omega = log_spaced_frequencies(table.dim // 2, table.base, guard=table.variant == "tensor2tensor").astype(F32)
    angles = positions * omega  # float32 [rows, dim/2]
    pe = np.zeros((table.rows, table.dim), dtype=F32)
    if table.variant == "paper":
        pe[:, 0::2], pe[:, 1::2] = np.sin(angles), np.cos(angles)
    else:
        pe[:, : table.dim // 2], pe[:, table.dim // 2:] = np.sin(angles), np.cos(angles)
        if table.variant == "fairseq" and table.offset <= table.padding_idx < table.offset + table.rows:
            pe[table.padding_idx - table.offset] = 0.0
    return {"pe": cast(pe, table.dtype)}


def _sin_cos_columns(table: SinusoidalTable, pe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sin, cos) [rows, dim/2] of a table laid out as `table.variant` lays it out."""
    half = table.dim // 2
    if table.variant == "paper":
        return pe[:, 0:2 * half:2], pe[:, 1:2 * half:2]
    return pe[:, :half], pe[:, half:2 * half]


def estimate_base(table: SinusoidalTable, pe: np.ndarray) -> float | None:
    """The base whose frequencies fit the upload's per-column angle steps (as RoPE's theta is estimated):
    log(omega_i) is linear in i with slope −2·log(base)/dim (paper, marian) or −log(base)/(dim/2 − 1)
    (the log-spaced variants). Rows that are all zero (fairseq's padding row) are left out."""
    half = table.dim // 2
    if table.rows < 2 or half < 2 or pe.shape != (table.rows, table.dim):
        return None
    sin, cos = _sin_cos_columns(table, pe.astype(np.float64))
    angles = np.arctan2(sin, cos)  # [rows, half]
    live = np.any(pe != 0, axis=1)
    pairs = live[1:] & live[:-1]
    if pairs.sum() < 1:
        return None
    steps = np.angle(np.exp(1j * np.diff(angles, axis=0)))[pairs].mean(axis=0)  # [half]
    index = np.arange(half, dtype=np.float64)
    usable = (steps > 0) & (steps * max(int(pairs.sum()), 1) > 1e-2) & (steps < 3.0)
    if usable.sum() < 2:
        return None
    slope = -np.polyfit(index[usable], np.log(steps[usable]), 1)[0]
    exponent = table.dim / 2 if table.variant in ("paper", "marian") else max(half - 1, 1)
    base = math.exp(slope * exponent)
    if not math.isfinite(base) or base <= 1:
        return None
    nice = float(f"{base:.3g}")  # bases are round numbers: 10000, 500
    return nice if abs(nice - base) <= 2e-3 * base else base


def _base_table(table: SinusoidalTable, observed: Mapping[str, np.ndarray], found: dict[str, str]) -> Tables | None:
    pe = observed.get("pe")
    base = None if pe is None else estimate_base(table, pe)
    if base is None or base == table.base:
        return None
    found["base"] = repr(base)
    return table.table(base=base)


def sinusoidal_hypotheses(table: SinusoidalTable, observed: Mapping[str, np.ndarray] | None = None
                          ) -> list[Hypothesis]:
    """The sinusoidal mistakes that apply to `table` (even dim for the ones that pair sin and cos); `observed`
    (the upload) is read by the base estimate only."""
    out = [Hypothesis(f"offset_{shift:+d}", f"your rows start at position {table.offset + shift} instead of "
                      f"{table.offset} (off by {shift:+d})",
                      partial(table.table, offset=table.offset + shift)) for shift in (1, -1)]
    start = table.offset + table.padding_idx + 1
    out.append(Hypothesis("padding_offset", f"your positions start at padding_idx + 1 = {start} (fairseq's "
                          "make_positions) while the table was asked from position "
                          f"{table.offset}", lambda: table.table(offset=start)))
    for variant in get_args(SinusoidalVariant):
        if variant != table.variant and not (variant == "fairseq" and table.dim < 4):
            out.append(Hypothesis(f"variant_{variant}", f"you wrote the {variant} variant (its column layout and "
                                  f"frequency spacing), the request is {table.variant}",
                                  partial(table.table, variant=variant)))
    if table.dim % 2 == 0:
        out.append(Hypothesis("sin_cos_swapped", "sin and cos are exchanged (cos in the sin columns)",
                              lambda: _swapped(table)))
        out.append(Hypothesis("float32_angles", "your angles are position × omega in float32: the error grows "
                              "linearly with the position", lambda: _float32_angles(table)))
        found: dict[str, str] = {}
        out.append(Hypothesis("base", f"your base is not the requested {table.base:g}; `found` is the base your "
                              "column frequencies fit", partial(_base_table, table, observed or {}, found), found))
    return out + storage_hypotheses(table.table, table.dtype)
