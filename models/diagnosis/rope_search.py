"""RoPE hypotheses found by search: scaling the request does not ask for (the scaled type and its factor
estimated from the upload), and two mistakes at once.

Both read the upload's per-column angle step (`angle_steps`: the effective inverse frequencies), so the
search itself costs no table: candidates are compared frequency by frequency, and only the best of each
kind is built. Bounds: `FACTORS` × `ORIGINAL_LENGTHS` inverse-frequency vectors per scaled type, one table
per scaled type, and at most nine tables of pairs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np

from posenc.models.diagnosis.hypothesis import Hypothesis, Tables
from posenc.models.errors import ParameterError
from posenc.models.rope import Layout, RopeParameters, inv_freq_and_attention_factor
from posenc.models.rope_params import make_rope_parameters
from posenc.models.rope_types import ROPE_TYPES, RopeTypeSpec, rope_type_spec

# The scale factors and original context lengths published configurations use (Llama 3.1: 8 / 8192, Qwen
# yarn: 4 / 32768, CodeLlama linear: 4, DeepSeek: 40 / 4096): the grid the estimate searches.
FACTORS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 40.0, 64.0)
ORIGINAL_LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
LLAMA3_SMOOTHING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}  # Llama 3.1's published values
ESTIMABLE = frozenset({"factor", "original_max_position_embeddings", "max_position_embeddings", "low_freq_factor",
                       "high_freq_factor"})
FIT = 1e-3  # relative step error below which a candidate's frequencies are taken as the upload's


def estimable_types() -> list[str]:
    """Scaled rope_types whose parameters the search can enumerate (not variants, not per-frequency lists)."""
    return [name for name, spec in ROPE_TYPES.items()
            if spec.scaled and not spec.engine_variant and not spec.whole_head and set(spec.required) <= ESTIMABLE]


def _candidates(spec: RopeTypeSpec, base: RopeParameters) -> Iterator[dict[str, Any]]:
    lengths: tuple[int | None, ...] = ORIGINAL_LENGTHS if {"original_max_position_embeddings",
                                                           "max_position_embeddings"} & set(spec.required) else (None,)
    for factor in FACTORS:
        for length in lengths:
            fields: dict[str, Any] = {"factor": factor}
            if "original_max_position_embeddings" in spec.required:
                fields["original_max_position_embeddings"] = length
            if "max_position_embeddings" in spec.required:
                fields["max_position_embeddings"] = length
            if "low_freq_factor" in spec.required:
                fields |= LLAMA3_SMOOTHING
            yield fields


def _step_error(inv_freq: np.ndarray, steps: np.ndarray, rows: int) -> float:
    """Largest relative difference of the usable columns (a column must turn measurably and never wrap)."""
    usable = (steps > 0) & (steps * max(rows - 1, 1) > 1e-2) & (steps < 3.0)
    if usable.sum() < 2:
        return math.inf
    return float(np.max(np.abs(inv_freq.astype(np.float64)[usable] / steps[usable] - 1.0)))


def estimate_scaling(base: RopeParameters, rope_type: str, steps: np.ndarray, seq_len: int, rows: int
                     ) -> tuple[RopeParameters, float] | None:
    """The parameters of `rope_type` (on `base`'s head, theta) whose frequencies fit `steps` best, and that fit."""
    spec = rope_type_spec(rope_type)
    best: tuple[RopeParameters, float] | None = None
    for fields in _candidates(spec, base):
        try:
            params = make_rope_parameters(head_dim=base.head_dim, rotary_dim=base.rotary_dim,
                                          rope_theta=base.rope_theta, rope_type=rope_type, **fields)
        except ParameterError:
            continue
        inv_freq, _ = inv_freq_and_attention_factor(params, seq_len)
        error = _step_error(inv_freq, steps, rows)
        if best is None or error < best[1]:
            best = (params, error)
    return best


def _describe(params: RopeParameters) -> dict[str, str]:
    spec = rope_type_spec(params.rope_type)
    return {"rope_type": params.rope_type,
            **{name: f"{getattr(params, name):g}" for name in spec.required if getattr(params, name) is not None}}


def reverse_scaling_hypotheses(table: Any, observed: Mapping[str, np.ndarray],
                               steps_of: Callable[[Layout], np.ndarray | None]) -> list[Hypothesis]:
    """For an unscaled request: the upload is a scaled table (each estimable type, its factor estimated)."""
    if rope_type_spec(table.params.rope_type).scaled or table.rows < 2:
        return []
    out = []
    for rope_type in estimable_types():
        found: dict[str, str] = {}

        def build(rope_type: str = rope_type, found: dict[str, str] = found) -> Tables | None:
            steps = steps_of(table.layout)
            fitted = None if steps is None else estimate_scaling(table.params, rope_type, steps,
                                                                 table.offset + table.rows, table.rows)
            if fitted is None or not math.isfinite(fitted[1]):
                return None
            params = fitted[0]
            found.update(_describe(params))
            inv_freq, factor = table.frequencies(params)
            return table.build(inv_freq, factor)

        out.append(Hypothesis(f"scaling_applied_{rope_type}", f"your table is {rope_type}-scaled RoPE although the "
                              "request has no scaling; `found` is the scaling your frequencies fit", build, found))
    return out


def pair_hypotheses(table: Any, observed: Mapping[str, np.ndarray],
                    steps_of: Callable[[Layout], np.ndarray | None],
                    theta_of: Callable[[np.ndarray], float | None]) -> list[Hypothesis]:
    """Two mistakes at once, among layout, theta, an offset of ±1 and cos/sin swapped (at most nine)."""
    p = table.params
    inv_freq, factor = table.frequencies()
    other: Layout | None = None
    if table.form == "full":
        other = "interleaved" if table.layout == "half" else "half"

    def swap(built: Tables) -> Tables:
        return {**built, "cos": built["sin"], "sin": built["cos"]}

    def with_theta(layout: Layout, swapped: bool, found: dict[str, str]) -> tuple[np.ndarray, float] | None:
        steps = steps_of(layout)
        if steps is None:
            return None
        theta = theta_of(-steps if swapped else steps)
        if theta is None or theta == p.rope_theta:
            return None
        found["rope_theta"] = repr(theta)
        return table.frequencies(dataclasses.replace(p, rope_theta=theta))

    out: list[Hypothesis] = []

    def add(name: str, why: str, build: Callable[[], Tables | None], found: dict[str, str] | None = None) -> None:
        out.append(Hypothesis(name, f"two mistakes at once: {why}", build, found if found is not None else {}))

    if other is not None:
        layout_found: dict[str, str] = {}

        def layout_theta() -> Tables | None:
            fitted = with_theta(other, False, layout_found)
            return None if fitted is None else table.build(*fitted, layout=other)

        add("layout+theta", f"the {other} layout and another base (rope_theta)", layout_theta, layout_found)
        for shift in (1, -1):
            add(f"layout+offset_{shift:+d}", f"the {other} layout and rows off by {shift:+d}",
                partial(table.build, inv_freq, factor, shift=shift, layout=other))
        add("layout+cos_sin_swapped", f"the {other} layout and cos/sin exchanged",
            lambda: swap(table.build(inv_freq, factor, layout=other)))
    for shift in (1, -1):
        shift_found: dict[str, str] = {}

        def theta_offset(shift: int = shift, found: dict[str, str] = shift_found) -> Tables | None:
            fitted = with_theta(table.layout, False, found)
            return None if fitted is None else table.build(*fitted, shift=shift)

        add(f"theta+offset_{shift:+d}", f"another base (rope_theta) and rows off by {shift:+d}", theta_offset,
            shift_found)
    swap_found: dict[str, str] = {}

    def theta_swapped() -> Tables | None:
        fitted = with_theta(table.layout, True, swap_found)
        return None if fitted is None else swap(table.build(*fitted))

    add("theta+cos_sin_swapped", "another base (rope_theta) and cos/sin exchanged", theta_swapped, swap_found)
    return out
