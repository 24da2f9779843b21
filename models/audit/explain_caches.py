"""Name the mistake in stored cos/sin caches (onnxruntime's cos_cache / sin_cache [rows, rotary_dim/2]): the
check's RoPE hypotheses (`posenc.models.diagnosis.rope`) on the cache's first rows, read as a form="half" table
of the cache's dtype, plus a cache rounded through a second reduced dtype, plus a cache shorter than the context.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from posenc.models.audit.divergence import Divergence
from posenc.models.audit.found import Caches, Fact
from posenc.models.audit.frequencies import theta_of
from posenc.models.diagnosis.agreement import residual
from posenc.models.diagnosis.hypothesis import REDUCED_STORAGE, Hypothesis, Tables
from posenc.models.diagnosis.rope import RopeTable, angle_steps, rope_hypotheses
from posenc.models.rope_params import RopeParameters

DIAGNOSED_ROWS = 4096  # rows of a cache the hypotheses are built for (bounds their work)


def _rounded_twice(table: RopeTable) -> list[Hypothesis]:
    """The golden cache rounded to another reduced dtype first, then to the cache's."""
    out = []
    for name, reduced in REDUCED_STORAGE.items():
        if reduced == table.dtype:
            continue

        def build(reduced: np.dtype = reduced) -> Tables:
            ref = RopeTable(table.params, table.rows, 0, "half", "half", np.dtype(np.float64)).reference()
            return {k: ref[k].astype(reduced).astype(table.dtype) for k in ("cos", "sin")}

        out.append(Hypothesis("cache_rounded_twice", f"the cache was rounded to {name} and then to "
                              f"{table.dtype} (two roundings, the second on the first's error)", build))
    return out


def _scaled_theta(table: RopeTable, observed: Tables) -> list[Hypothesis]:
    """Another base with the reference's scaling kept (the check's theta estimate assumes unscaled columns): the
    base of the two highest-frequency columns, which llama3 and yarn leave unscaled."""
    steps = angle_steps(observed["cos"], observed["sin"], "half", "half", table.params.n_frequencies)
    theta = theta_of(steps.astype(np.float32), table.params.rotary_dim)
    if theta is None or theta == table.params.rope_theta or table.rows < 2:
        return []
    params = dataclasses.replace(table.params, rope_theta=theta)

    def build() -> Tables:
        inv_freq, factor = table.frequencies(params)
        return table.build(inv_freq, factor)

    return [Hypothesis("theta", f"the base (rope_theta) is {theta:g}, the model's is {table.params.rope_theta:g} "
                       f"(its {table.params.rope_type} scaling kept)", build, {"rope_theta": f"{theta:g}"})]


def explain_caches(params: RopeParameters, caches: Caches, divergence: Divergence) -> list[Fact]:
    """Facts on the caches: their length against the context, and their values (a named mistake when they
    diverge)."""
    facts = []
    rows = caches.cos.shape[0]
    if divergence.missing_from is not None:
        facts.append(Fact("cache_rows", divergence.context_length, rows, "wrong", "cache_shorter_than_context",
                          f"the caches hold {rows} positions; the context is {divergence.context_length}: "
                          f"positions from {rows} on have no row"))
    else:
        facts.append(Fact("cache_rows", divergence.context_length, rows, "ok"))
    if caches.cos.shape != caches.sin.shape or caches.cos.ndim != 2:
        facts.append(Fact("cache_shape", "cos and sin [rows, rotary_dim/2]", [list(caches.cos.shape),
                          list(caches.sin.shape)], "wrong", "cache_shape_wrong", "cos and sin differ in shape"))
        return facts
    if divergence.first_position is None or divergence.first_position >= rows:
        facts.append(Fact("cache_values", "golden table", "within the contract", "ok"))
        return facts
    shown = min(rows, DIAGNOSED_ROWS)
    table = RopeTable(params, shown, 0, "half", "half", caches.cos.dtype)
    observed = {"cos": caches.cos[:shown], "sin": caches.sin[:shown]}
    best: tuple[float, Hypothesis] | None = None
    if caches.cos.shape[1] == params.n_frequencies:
        for hypothesis in [*rope_hypotheses(table, observed), *_scaled_theta(table, observed), *_rounded_twice(table)]:
            built = hypothesis.build()
            if built is None:
                continue
            score = max(residual(observed[k], built[k]) for k in ("cos", "sin"))
            if best is None or score < best[0]:
                best = (score, hypothesis)
    eps = float(np.finfo(caches.cos.dtype).eps) if caches.cos.dtype.kind == "f" else 1e-2
    explains = best is not None and best[0] <= 2 * eps + 4e-7 * shown
    name = best[1].name if best is not None and explains else "cache_values_differ"
    why = best[1].explanation if best is not None and explains else "the caches match no known mistake"
    found = "".join(f" [{k} = {v}]" for k, v in best[1].found.items()) if best is not None and explains else ""
    facts.append(Fact("cache_values", "golden table", f"diverges from position {divergence.first_position}",
                      "wrong", name, why + found))
    return facts
