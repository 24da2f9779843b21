"""Name the mistake in stored cos/sin caches (onnxruntime's cos_cache / sin_cache [rows, rotary_dim/2]): the
check's RoPE hypotheses (`posenc.models.diagnosis.rope`) on the cache's first rows, read as a form="half" table
of the cache's dtype, plus a cache rounded through a second reduced dtype, plus yarn's correction range rounded
the other way (`truncate`), plus a cache shorter than the context.

Caches chosen at run time (`BranchedCaches`: onnxruntime-genai's longrope `If` on the sequence length) are judged
branch by branch: the one taken past the threshold against the model's long table, the others against its short
one (the table up to original_max_position_embeddings), and the threshold against that length.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from posenc.models.audit.divergence import Divergence, compare_caches
from posenc.models.audit.found import Caches, Fact
from posenc.models.audit.frequencies import describe, golden, plain, theta_of
from posenc.models.diagnosis.agreement import residual
from posenc.models.diagnosis.hypothesis import REDUCED_STORAGE, Hypothesis, Tables
from posenc.models.diagnosis.rope import RopeTable, angle_steps, rope_hypotheses
from posenc.models.errors import ParameterError
from posenc.models.rope import inv_freq_and_attention_factor
from posenc.models.rope_frequencies import yarn_correction_range
from posenc.models.rope_params import RopeParameters, make_rope_parameters
from posenc.models.rope_types import rope_type_spec

DIAGNOSED_ROWS = 4096  # rows of a cache the hypotheses are built for (bounds their work)
SWAPPED = "longrope_short_long_swapped"
EXCHANGED = "the short and long caches are exchanged: the branch taken past the threshold holds the short table"


@dataclass(frozen=True)
class BranchedCaches(Caches):
    """Caches a graph chooses between at run time (an ONNX `If` on the sequence length): `cos`/`sin` those of the
    branch taken past `threshold` (found at `where`), `branches` the others with where each was found (longrope's
    short caches); `threshold` None when the condition was not read."""

    where: str = ""
    branches: tuple[tuple[str, Caches], ...] = ()
    threshold: int | float | None = None


@dataclass(frozen=True)
class _AtLength(RopeTable):
    """The first rows of caches `length` positions long, with the frequencies of that length: a scaling that
    chooses its frequencies by the sequence length (longrope's long factors past original_max_position_embeddings)
    computes every row of such caches with the long ones, the first rows included."""

    length: int = 0

    def frequencies(self, params: RopeParameters | None = None) -> tuple[np.ndarray, float]:
        return inv_freq_and_attention_factor(params or self.params, max(self.length, self.offset + self.rows))

    def reference(self) -> Tables:
        return self.build(*self.frequencies())


def _rounded_twice(table: RopeTable) -> list[Hypothesis]:
    """The golden cache rounded to another reduced dtype first, then to the cache's."""
    out = []
    for name, reduced in REDUCED_STORAGE.items():
        if reduced == table.dtype:
            continue

        def build(reduced: np.dtype = reduced) -> Tables:
            ref = dataclasses.replace(table, dtype=np.dtype(np.float64)).reference()
            return {k: ref[k].astype(reduced).astype(table.dtype) for k in ("cos", "sin")}

        out.append(Hypothesis("cache_rounded_twice", f"the cache was rounded to {name} and then to "
                              f"{table.dtype} (two roundings, the second on the first's error)", build))
    return out


def _scaled_theta(table: RopeTable, observed: Tables) -> list[Hypothesis]:
    """Another base with the reference's scaling kept (the check's theta estimate assumes unscaled columns): the
    base of the two highest-frequency columns, which llama3 and yarn leave unscaled, with the reference's own
    division of each column undone first (longrope divides every column by its factor; linear all alike)."""
    steps = angle_steps(observed["cos"], observed["sin"], "half", "half", table.params.n_frequencies)
    scaled = table.frequencies()[0].astype(np.float64)
    if scaled.shape == steps.shape and np.all(scaled > 0):
        steps = steps * (plain(table.params.rope_theta, table.params.rotary_dim).astype(np.float64) / scaled)
    theta = theta_of(steps.astype(np.float32), table.params.rotary_dim)
    if theta is None or theta == table.params.rope_theta or table.rows < 2:
        return []
    params = dataclasses.replace(table.params, rope_theta=theta)

    def build() -> Tables:
        inv_freq, factor = table.frequencies(params)
        return table.build(inv_freq, factor)

    return [Hypothesis("theta", f"the base (rope_theta) is {theta:g}, the model's is {table.params.rope_theta:g} "
                       f"(its {table.params.rope_type} scaling kept)", build, {"rope_theta": f"{theta:g}"})]


def _truncate_flipped(table: RopeTable) -> list[Hypothesis]:
    """yarn's correction range rounded the other way: onnxruntime-genai's yarn ramp skips transformers' floor of
    its low end and ceil of its high end (`truncate`, true unless the config says false)."""
    p = table.params
    if "truncate" not in rope_type_spec(p.rope_type).reads:
        return []
    other = dataclasses.replace(p, truncate=not p.truncate)
    mine, theirs = yarn_correction_range(p), yarn_correction_range(other)
    if mine == theirs:
        return []

    def build() -> Tables:
        inv_freq, factor = table.frequencies(other)
        return table.build(inv_freq, factor)

    found = {"correction_range": f"{theirs[0]:.4g}..{theirs[1]:.4g}, the model's {mine[0]:.4g}..{mine[1]:.4g}"}
    if p.truncate:
        return [Hypothesis("yarn_without_truncate", "the yarn ramp's correction range was not rounded to whole dims "
                           "(transformers' truncate=True floors its low end and ceils its high end): the frequencies "
                           "inside the range blend extrapolation and interpolation differently (onnxruntime-genai's "
                           "builder skips the rounding)", build, found)]
    return [Hypothesis("yarn_with_truncate", "the yarn ramp's correction range was rounded to whole dims; the "
                       "model's is not (truncate=false)", build, found)]


def _other_width(params: RopeParameters, table: RopeTable, observed: Tables) -> tuple[float, Hypothesis] | None:
    """Caches of another width than the model's rotary_dim / 2: the model's RoPE computed over 2 x their columns
    (a partial rotary factor dropped or misread by the tool that wrote them), with its residual; None when that
    RoPE does not resolve."""
    width = 2 * observed["cos"].shape[1]
    try:
        other = make_rope_parameters(**{**describe(params), "head_dim": max(params.head_dim, width),
                                        "rotary_dim": width})
    except ParameterError:
        return None
    built = dataclasses.replace(table, params=other).reference()
    hypothesis = Hypothesis("partial_rotary_dim_wrong", f"the caches rotate {width} channels of each head, with the "
                            f"frequencies of that dimension; the model rotates {params.rotary_dim}", lambda: built)
    return max(residual(observed[k], built[k]) for k in ("cos", "sin")), hypothesis


def _diagnose(params: RopeParameters, caches: Caches) -> tuple[str, str]:
    """The mistake the diverging caches' first rows show (its name and sentence), or `cache_values_differ`."""
    rows = caches.cos.shape[0]
    shown = min(rows, DIAGNOSED_ROWS)
    table = RopeTable(params, shown, 0, "half", "half", caches.cos.dtype)
    if not np.array_equal(table.frequencies()[0], inv_freq_and_attention_factor(params, rows)[0]):
        table = _AtLength(params, shown, 0, "half", "half", caches.cos.dtype, length=rows)
    observed = {"cos": caches.cos[:shown], "sin": caches.sin[:shown]}
    best: tuple[float, Hypothesis] | None = None
    if caches.cos.shape[1] == params.n_frequencies:
        for hypothesis in [*_truncate_flipped(table), *rope_hypotheses(table, observed),
                           *_scaled_theta(table, observed), *_rounded_twice(table)]:
            built = hypothesis.build()
            if built is None:
                continue
            score = max(residual(observed[k], built[k]) for k in ("cos", "sin"))
            if best is None or score < best[0]:
                best = (score, hypothesis)
    else:
        best = _other_width(params, table, observed)
    eps = float(np.finfo(caches.cos.dtype).eps) if caches.cos.dtype.kind == "f" else 1e-2
    if best is None or best[0] > 2 * eps + 4e-7 * shown:
        return "cache_values_differ", "the caches match no known mistake"
    return best[1].name, best[1].explanation + "".join(f" [{k} = {v}]" for k, v in best[1].found.items())


def explain_caches(params: RopeParameters, caches: Caches, divergence: Divergence) -> list[Fact]:
    """Facts on the caches: their length against the context, and their values (a named mistake when they
    diverge); for `BranchedCaches`, every branch and the threshold choosing between them."""
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
    else:
        name, why = _diagnose(params, caches)
        facts.append(Fact("cache_values", "golden table", f"diverges from position {divergence.first_position}",
                          "wrong", name, why))
    if isinstance(caches, BranchedCaches):
        facts += _branch_facts(params, caches, divergence, facts)
    return facts


def _within(gold: tuple[np.ndarray, float], caches: Caches, rows: int) -> bool:
    """The caches' first `rows` rows are the golden table's within the contract."""
    rows = min(rows, caches.cos.shape[0])
    return compare_caches(gold, caches.cos, caches.sin, rows).first_position is None


def _branch_facts(params: RopeParameters, caches: BranchedCaches, divergence: Divergence, facts: list[Fact]
                  ) -> list[Fact]:
    """The other branches of caches chosen at run time, each against the table it stands for (longrope: the short
    one up to the switch length), and the condition's threshold against that length. A longrope pair whose long
    branch holds the short table and the other the long one is `longrope_short_long_swapped` (the facts already
    in `facts` are renamed so)."""
    spec = rope_type_spec(params.rope_type)
    switch = spec.switch_length(params) if spec.switch_length is not None else None
    out = []
    if switch is None:
        out.append(Fact("cache_branch_threshold", None, caches.threshold, "note", None,
                        f"the caches are chosen at run time; the model has one {params.rope_type} table at every "
                        "length: each branch is compared with it"))
    elif caches.threshold is None:
        out.append(Fact("cache_branch_threshold", switch, None, "note", None, "the condition choosing between the "
                        f"branches was not read: {caches.where or 'the first branch'} is taken as the long one"))
    else:
        ok = caches.threshold == switch
        out.append(Fact("cache_branch_threshold", switch, caches.threshold, "ok" if ok else "wrong",
                        None if ok else "scaling_original_length_wrong", "" if ok else
                        f"the graph takes the long caches past {caches.threshold} positions; the model switches to "
                        f"its long factors past original_max_position_embeddings = {switch}"))
    length = divergence.context_length if switch is None else switch
    reference = golden(params, length)
    gold = (reference.inv_freq, reference.attention_factor)
    swapped = False
    if switch is not None and len(caches.branches) == 1 and divergence.first_position is not None:
        long = golden(params, switch + 1)
        swapped = _within(gold, caches, switch) and \
            _within((long.inv_freq, long.attention_factor), caches.branches[0][1], divergence.context_length)
    for index, (where, branch) in enumerate(caches.branches):
        suffix = ("short" if switch is not None else "branch") + (f"[{index}]" if len(caches.branches) > 1 else "")
        rows = branch.cos.shape[0]
        if branch.cos.shape != branch.sin.shape or branch.cos.ndim != 2:
            continue
        seen = compare_caches(gold, branch.cos, branch.sin, length)
        what = "the short caches" if switch is not None else f"the caches of {where}"
        expected = "golden table" if switch is None else "golden short table"
        if seen.missing_from is not None:
            out.append(Fact(f"cache_rows.{suffix}", length, rows, "wrong", "cache_shorter_than_context",
                            f"{what} hold {rows} positions; they serve {length}: positions from {rows} on have no "
                            "row"))
        else:
            out.append(Fact(f"cache_rows.{suffix}", length, rows, "ok"))
        if seen.first_position is None or seen.first_position >= rows:
            out.append(Fact(f"cache_values.{suffix}", expected, "within the contract", "ok"))
            continue
        name, why = (SWAPPED, EXCHANGED) if swapped else _diagnose(params, branch)
        out.append(Fact(f"cache_values.{suffix}", expected, f"diverges from position {seen.first_position}",
                        "wrong", name, f"{where}: {why}"))
    if swapped:  # the long branch's rows and values: the same mistake
        for i, fact in enumerate(facts):
            if fact.name in ("cache_rows", "cache_values") and fact.failing:
                facts[i] = dataclasses.replace(fact, mistake=SWAPPED,
                                               explanation=f"{caches.where}: {EXCHANGED} ({fact.explanation})")
    return out
