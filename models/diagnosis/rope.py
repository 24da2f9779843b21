"""RoPE hypotheses: the known ways a port's cos/sin tables differ from transformers' (docs/ENCODINGS.md §1, §2).

Every hypothesis rebuilds `cos`, `sin` and `inv_freq` exactly as `posenc.models.rope.rope_cos_sin` does
(float32 inv_freq, float64 angles, cast once) except for its one mistake. The base (theta) is
estimated from the uploaded tables: the per-position angle step of each column is the mean of the
wrapped differences of atan2(sin, cos) (telescoping, so its error shrinks with the number of rows),
and log(step_i) is linear in the column index with slope −2·log(theta)/rotary_dim.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from functools import partial

import numpy as np

from posenc.models.diagnosis.hypothesis import Hypothesis, Tables, storage_hypotheses
from posenc.models.diagnosis.rope_search import pair_hypotheses, reverse_scaling_hypotheses
from posenc.models.dtypes import cast
from posenc.models.rope import Form, Layout, RopeParameters, inv_freq_and_attention_factor, rope_cos_sin
from posenc.models.rope_types import DEFAULT_ROPE_TYPE, rope_type_spec

F32 = np.float32


@dataclasses.dataclass(frozen=True)
class RopeTable:
    """What a RoPE table request asks for: resolved parameters, rows (from `offset`), layout, form, dtype."""

    params: RopeParameters
    rows: int
    offset: int
    layout: Layout
    form: Form
    dtype: np.dtype

    def reference(self) -> Tables:
        cos, sin, info = rope_cos_sin(self.params, self.rows, self.offset, self.layout, self.form, self.dtype)
        return {"cos": cos, "sin": sin, "inv_freq": info.inv_freq}

    def build(self, inv_freq: np.ndarray, attention_factor: float, *, shift: int = 0, layout: Layout | None = None,
              float32_angles: bool = False) -> Tables:
        """cos/sin [rows, width] from a float32 inv_freq, the rows starting at offset + shift."""
        positions = np.arange(self.offset + shift, self.offset + shift + self.rows, dtype=np.float64)  # [rows]
        if float32_angles:
            # transformers' forward: position_ids.float() @ inv_freq, cos/sin and the factor in float32
            angles32 = positions.astype(F32)[:, None] * inv_freq[None, :]
            cos, sin = np.cos(angles32) * F32(attention_factor), np.sin(angles32) * F32(attention_factor)
        else:
            angles = positions[:, None] * inv_freq.astype(np.float64)[None, :]  # [rows, n_frequencies]
            cos, sin = np.cos(angles) * attention_factor, np.sin(angles) * attention_factor
        cos, sin = cast(cos, self.dtype), cast(sin, self.dtype)
        if self.form == "full":
            use = layout or self.layout
            if use == "half":
                cos, sin = np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1)
            else:
                cos, sin = np.repeat(cos, 2, axis=1), np.repeat(sin, 2, axis=1)
        return {"cos": cos, "sin": sin, "inv_freq": inv_freq.astype(F32)}

    def frequencies(self, params: RopeParameters | None = None) -> tuple[np.ndarray, float]:
        return inv_freq_and_attention_factor(params or self.params, self.offset + self.rows)


def angle_steps(cos: np.ndarray, sin: np.ndarray, form: Form, layout: Layout, n_frequencies: int) -> np.ndarray:
    """Mean angle advance per row of each frequency column, from a cos/sin pair. float64 [n_frequencies]."""
    if form == "full":
        columns = slice(0, n_frequencies) if layout == "half" else slice(0, 2 * n_frequencies, 2)
        cos, sin = cos[:, columns], sin[:, columns]
    angles = np.arctan2(sin.astype(np.float64), cos.astype(np.float64))  # [rows, n]
    steps = np.angle(np.exp(1j * np.diff(angles, axis=0)))  # wrapped to (−π, π]
    return np.asarray(steps.mean(axis=0))


def estimate_theta(steps: np.ndarray, rotary_dim: int, rows: int) -> float | None:
    """Base whose default inverse frequencies fit `steps` best (log-linear least squares), None if unfit."""
    index = np.arange(len(steps), dtype=np.float64)
    # a column whose total angle span is tiny is dominated by the table's rounding
    usable = (steps > 0) & (steps * max(rows - 1, 1) > 1e-2) & (steps < 3.0)
    if usable.sum() < 2:
        return None
    slope, _ = np.polyfit(index[usable], np.log(steps[usable]), 1)
    theta = math.exp(-slope * rotary_dim / 2)
    if not math.isfinite(theta) or theta <= 1:
        return None
    nice = float(f"{theta:.3g}")  # bases are round numbers: 10000, 500000, 1e6
    return nice if abs(nice - theta) <= 2e-3 * theta else theta


def rope_hypotheses(table: RopeTable, observed: Mapping[str, np.ndarray]) -> list[Hypothesis]:
    """The RoPE mistakes that apply to `table`; `observed` (the upload) is read by the theta estimate only."""
    p = table.params
    inv_freq, factor = table.frequencies()
    out: list[Hypothesis] = []
    if table.form == "full":
        other: Layout = "interleaved" if table.layout == "half" else "half"
        said = {"half": "rotate_half (NeoX/Llama: cat(freqs, freqs))", "interleaved": "GPT-J pairs (each frequency "
                "twice in a row)"}
        out.append(Hypothesis("layout", f"you wrote {said[other]}, the model expects {said[table.layout]}",
                              lambda: table.build(inv_freq, factor, layout=other)))

    def swapped() -> Tables:
        built = table.build(inv_freq, factor)
        return {"cos": built["sin"], "sin": built["cos"], "inv_freq": built["inv_freq"]}

    out.append(Hypothesis("cos_sin_swapped", "your cos table holds sin and your sin table holds cos", swapped))
    for shift in (1, -1):
        out.append(Hypothesis(f"offset_{shift:+d}", f"your rows start at position {table.offset + shift} instead of "
                              f"{table.offset} (off by {shift:+d})",
                              partial(table.build, inv_freq, factor, shift=shift)))
    spec = rope_type_spec(p.rope_type)
    if spec.scaled:
        plain, _ = table.frequencies(dataclasses.replace(p, rope_type=DEFAULT_ROPE_TYPE))
        out.append(Hypothesis("scaling_not_applied", f"your table is unscaled RoPE: the {p.rope_type} scaling of "
                              "the frequencies (and its attention factor) was not applied",
                              lambda: table.build(plain, 1.0)))
        twice = (inv_freq * (inv_freq / plain)).astype(F32)
        out.append(Hypothesis("scaling_applied_twice", f"the {p.rope_type} frequency scaling was applied twice "
                              "(e.g. inv_freq divided by the factor again)", lambda: table.build(twice, factor)))
    if factor != 1.0:
        out.append(Hypothesis("attention_factor_missing", f"cos and sin lack the attention factor {factor:.6g} "
                              f"({p.rope_type} folds it into the tables)", lambda: table.build(inv_freq, 1.0)))
    if p.rotary_dim < p.head_dim and not spec.whole_head:  # whole-head types divide by head_dim already
        spread = (F32(1.0) / np.power(np.float64(p.rope_theta), np.arange(0, p.rotary_dim, 2) / p.head_dim)
                  .astype(F32)).astype(F32)
        out.append(Hypothesis("partial_rotary", f"partial rotary on the wrong channels: your frequencies spread over "
                              f"all {p.head_dim} head channels (exponent 2i/head_dim) instead of the "
                              f"{p.rotary_dim} rotated ones", lambda: table.build(spread, factor)))
    # after partial_rotary: a table whose exponents use head_dim is also a table of another base
    found: dict[str, str] = {}
    out.append(Hypothesis("theta", f"your base (rope_theta) is not the requested {p.rope_theta:g}; `found` is the "
                          "base your column frequencies fit", lambda: _theta_table(table, observed, found), found))
    out.append(Hypothesis("float32_angles", "your angles are position × inv_freq in float32 (as transformers' "
                          "forward): the error grows linearly with the position",
                          lambda: table.build(inv_freq, factor, float32_angles=True)))
    steps_of = partial(_observed_steps, table, observed)
    out += reverse_scaling_hypotheses(table, observed, steps_of)
    out += storage_hypotheses(table.reference, table.dtype)
    # pairs last: a single mistake that explains the upload ranks first
    return out + pair_hypotheses(table, observed, steps_of,
                                 lambda steps: estimate_theta(steps, p.rotary_dim, table.rows))


def _observed_steps(table: RopeTable, observed: Mapping[str, np.ndarray], layout: Layout) -> np.ndarray | None:
    """The upload's angle step per frequency column, read in `layout` (None: no cos/sin pair to read, one row,
    or a whole-head type, whose zero columns have no step)."""
    cos, sin = observed.get("cos"), observed.get("sin")
    if cos is None or sin is None or table.rows < 2 or rope_type_spec(table.params.rope_type).whole_head:
        return None
    return angle_steps(cos, sin, table.form, layout, table.params.n_frequencies)


def _theta_table(table: RopeTable, observed: Mapping[str, np.ndarray], found: dict[str, str]) -> Tables | None:
    p = table.params
    cos, sin = observed.get("cos"), observed.get("sin")
    # the estimate fits theta^(-2i/rotary_dim) to every column: not a whole-head table (head_dim exponent, zeros)
    if cos is None or sin is None or table.rows < 2 or rope_type_spec(p.rope_type).whole_head:
        return None
    steps = angle_steps(cos, sin, table.form, table.layout, p.n_frequencies)
    theta = estimate_theta(steps, p.rotary_dim, table.rows)
    if theta is None or theta == p.rope_theta:
        return None
    inv_freq, factor = table.frequencies(dataclasses.replace(p, rope_theta=theta))
    found["rope_theta"] = repr(theta)
    return table.build(inv_freq, factor)
