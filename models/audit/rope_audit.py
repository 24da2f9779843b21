"""Judge a file's position facts against a reference, fact by fact, and the tables they imply.

`audit(found, reference)` → `Audit`: the facts (expected, found, verdict, the named mistake), the
frequencies the file implies, and their consequence (`posenc.models.audit.divergence`). Without a RoPE
reference the file's own metadata is the reference for its caches and constants (internal consistency). A
reference guessed by shape alone (no --preset, no --config) is no model's word: the file is judged against
itself, and where it differs from the assumed preset a note says how.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from posenc.models.alibi import alibi_slopes
from posenc.models.audit.consistency import consistency_facts
from posenc.models.audit.divergence import Divergence, compare_caches, compare_frequencies
from posenc.models.audit.explain_caches import explain_caches
from posenc.models.audit.factor_facts import frequency_factor_facts, longrope_factor_facts
from posenc.models.audit.found import OPTIONAL_POSITION_SOURCES, Fact, Found, Verdict
from posenc.models.audit.frequencies import Frequencies, describe, divided, explain, golden, same
from posenc.models.audit.llama_cpp import (
    ROPE_SWITCH,
    ROPE_SWITCH_KEY,
    RUNTIME_SCALING,
    WRITTEN_CONTEXT,
    YARN_MULTIPLIER,
    YARN_MULTIPLIER_KEY,
    YARN_ROUNDING,
)
from posenc.models.audit.reference import SLIDING_LAYER_TYPE, Reference, expected_sizes
from posenc.models.bounds import DEFAULT_ROPE_THETA, MAX_DIM
from posenc.models.diagnosis.agreement import number
from posenc.models.errors import ParameterError
from posenc.models.rope_frequencies import ntk_alpha_rope_theta
from posenc.models.rope_params import RopeParameters, make_rope_parameters
from posenc.models.rope_types import GGUF_FREQ_FACTOR_TYPES, GGUF_SCALING_TYPES, rope_type_spec


@dataclass
class Audit:
    """The verdict on one file. verdict: "correct" (every fact as the named reference says and the tables within
    the contract), "wrong" (a fact is wrong or missing, or the tables diverge from a named reference's),
    "consistent" (no reference, a reference guessed by shape, or a file that states nothing the reference could
    judge: the file agrees with itself), "unchecked" (nothing to compare)."""

    found: Found
    reference: Reference
    facts: list[Fact] = field(default_factory=list)
    divergence: Divergence | None = None
    implied: Frequencies | None = None
    golden: Frequencies | None = None

    @property
    def failing(self) -> list[Fact]:
        return [f for f in self.facts if f.failing]

    @property
    def verdict(self) -> str:
        return verdict_of(self.facts, self.divergence, self.reference)

    def document(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict, "source": self.found.source, "reference": self.reference.document(),
            "found": self.found.summary(), "facts": [f.document() for f in self.facts],
            "mistakes": sorted({f.mistake for f in self.failing if f.mistake}),
            "notes": list(self.found.notes),
        }
        out["tables"] = None if self.divergence is None else self.divergence.document()
        return _json_ready(out)


def verdict_of(facts: list[Fact], divergence: Divergence | None, ref: Reference) -> str:
    """The verdict on `facts` and the tables (`divergence`) judged against `ref` (see `Audit`)."""
    diverges = divergence is not None and not divergence.within_contract
    if any(f.failing for f in facts) or (diverges and not ref.guessed):
        return "wrong"
    if not _judged_by_model(facts, divergence, ref):
        return "consistent" if facts or divergence is not None else "unchecked"
    return "correct"


def _judged_by_model(facts: list[Fact], divergence: Divergence | None, ref: Reference) -> bool:
    named = not ref.guessed and (ref.params is not None or ref.alibi_mode is not None
                                 or ref.learned_positions is not None)
    return named and (divergence is not None or any(f.verdict == "ok" for f in facts))


def _json_ready(value: Any) -> Any:
    """JSON has no infinities or NaN: "Infinity" / "NaN" as the service's json format spells them."""
    if isinstance(value, float):
        return number(value)
    if isinstance(value, dict):
        return {key: _json_ready(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(item) for item in value]
    return value


def _fact(facts: list[Fact], name: str, expected: Any, found: Any, mistake: str, why: str,
          missing_is: Verdict = "missing") -> bool:
    """Append a fact comparing two values (None found: `missing_is`); True when they agree."""
    if expected is None:
        return True
    if found is None:
        facts.append(Fact(name, expected, None, missing_is, mistake if missing_is == "missing" else None, why))
        return False
    agree = (np.isclose(float(found), float(expected), rtol=1e-6, atol=0.0) if isinstance(expected, float)
             else found == expected)
    facts.append(Fact(name, expected, found, "ok" if agree else "wrong", None if agree else mistake,
                      "" if agree else why))
    return bool(agree)


DEFAULT_CONTEXT = 4096  # the positions compared when neither the file nor the reference states a context length


def _context(found: Found, ref: Reference) -> int:
    return max(1, int(found.context_length or ref.context_length or DEFAULT_CONTEXT))


def _found_params(found: Found, ref_params: RopeParameters | None, facts: list[Fact]) -> RopeParameters | None:
    """The RoPE parameters the file's metadata states (GGUF, config.json); None where it states none."""
    head_dim = found.head_dim or (ref_params.head_dim if ref_params else None)
    rotary = found.rotary_dim or (ref_params.rotary_dim if ref_params and not found.head_dim else head_dim)
    if head_dim is None or rotary is None:
        return None
    if max(head_dim, rotary) > MAX_DIM:
        facts.append(Fact("rope_metadata", f"head and rotary dims <= {MAX_DIM}", max(head_dim, rotary), "wrong",
                          "metadata_invalid", "the file's head or rotary dimension is beyond any model"))
        return None
    scaling = {k: v for k, v in found.scaling.items() if v is not None}
    try:
        return make_rope_parameters(head_dim=max(head_dim, rotary), rotary_dim=rotary,
                                    rope_theta=found.rope_theta or DEFAULT_ROPE_THETA, **scaling)
    except ParameterError as exc:
        facts.append(Fact("rope_metadata", None, scaling, "wrong", "metadata_invalid", f"the file's RoPE "
                          f"metadata does not resolve: {exc}"))
        return None


def implied_frequencies(found: Found, ref_params: RopeParameters | None, context: int, facts: list[Fact]
                        ) -> Frequencies | None:
    """What a runtime computes from the file: its constant, its divisors, or its metadata; None when it states
    none of them."""
    if not found.states_frequencies:
        return None
    if found.inv_freq is not None:
        inv = found.inv_freq
        if inv.ndim == 2:  # [short, long]
            switch = None if ref_params is None else rope_type_spec(ref_params.rope_type).switch_length
            length = None if switch is None or ref_params is None else switch(ref_params)
            inv = inv[1] if length is not None and context > length else inv[0]
        return Frequencies(inv.astype(np.float32), found.attention_factor or 1.0)
    params = _found_params(found, ref_params, facts)
    if params is None:
        return None
    theta, n = params.rope_theta, params.rotary_dim
    if found.freq_factors is not None and found.freq_factors.shape == (n // 2,):
        return Frequencies(divided(theta, n, found.freq_factors), found.attention_factor or 1.0)
    if found.long_factors is not None and found.short_factors is not None:
        original = found.scaling.get("original_max_position_embeddings") or found.context_length or context
        factors = found.long_factors if context > original else found.short_factors
        if factors.shape == (n // 2,):
            return Frequencies(divided(theta, n, factors), found.attention_factor or golden(params, context)
                               .attention_factor)
    return golden(params, context)


def _rope_facts(found: Found, ref: Reference, params: RopeParameters, facts: list[Fact]) -> None:
    spec = rope_type_spec(params.rope_type)
    context = _context(found, ref)
    if found.rotary_dim is None and found.source in OPTIONAL_POSITION_SOURCES:
        facts.append(_not_stored("rotary_dim", params.rotary_dim, ref))
    else:
        _fact(facts, "rotary_dim", params.rotary_dim, found.rotary_dim, "partial_rotary_dim_wrong",
              f"the file rotates {found.rotary_dim} channels of each head; the model rotates {params.rotary_dim}")
    if found.source in ("gguf", "config.json"):
        theta = DEFAULT_ROPE_THETA if found.rope_theta is None else found.rope_theta  # llama.cpp's default
        if "rope_theta" in found.inherited:  # the sliding layers' base is not in the file: they get freq_base
            _fact(facts, "rope_theta", params.rope_theta, theta, "sliding_window_base_missing",
                  f"sliding-window layers use base {params.rope_theta:g}; the file does not say (freq_base_swa "
                  f"missing: they get freq_base, {theta:g})")
        else:
            key = "freq_base_swa" if found.source == "gguf" and found.layer_type == SLIDING_LAYER_TYPE \
                else "freq_base / rope_theta"
            default = " (a converter that did not read rope_theta writes the default)" \
                if theta == DEFAULT_ROPE_THETA else ""
            want, whose = params.rope_theta, ""
            if found.source == "gguf" and "alpha" in rope_type_spec(params.rope_type).reads:
                # llama.cpp has no alpha: the converter writes the stretched base (conversion/hunyuan.py)
                want, whose = ntk_alpha_rope_theta(params), " NTK-alpha base θ·α^(d/(d−2))"
            _fact(facts, "rope_theta", want, theta, "wrong_freq_base",
                  f"the file's base ({key}) is {theta:g}; the model's{whose} is {want:g}{default}")
    if ref.theta_swa is not None and found.source == "gguf":
        _fact(facts, "rope_theta_swa", ref.theta_swa, found.theta_swa, "sliding_window_base_missing",
              f"sliding-window layers use base {ref.theta_swa:g}; the file "
              + ("does not say (freq_base_swa missing: they get freq_base)" if found.theta_swa is None
                 else f"says {found.theta_swa}"))
    if ref.sections is not None:
        got = None if found.sections is None else tuple(found.sections[: len(ref.sections)])
        _fact(facts, "mrope_sections", ref.sections, got, "mrope_sections_wrong",
              f"M-RoPE sections {got} differ from the model's {ref.sections} (temporal, height, width)")
    if found.interleaved is not None:
        _fact(facts, "layout", "interleaved" if ref.interleaved else "half",
              "interleaved" if found.interleaved else "half", "interleaved_vs_half",
              "the rotation pairs channels " + ("(2i, 2i+1) (GPT-J)" if found.interleaved else "(i, i+d/2) "
                                                "(rotate_half)") + "; the model pairs them the other way")
    if found.source == "gguf":
        _gguf_scaling(found, params, context, facts)
    elif found.source == "config.json":
        found_type = found.scaling.get("rope_type")
        unscaled = found_type is not None and not rope_type_spec(found_type).scaled
        _fact(facts, "rope_type", params.rope_type, found_type,
              "scaling_missing" if unscaled else "scaling_type_wrong",
              f"the config resolves to unscaled RoPE ({found_type}): the model's {params.rope_type} scaling is "
              "missing" if unscaled else f"the config's scaling is {found_type}, the model's {params.rope_type}")
        if found_type != params.rope_type:
            return
        for name in sorted(spec.reads - {"short_factor", "long_factor", "truncate"}):
            if getattr(params, name) is not None:
                _fact(facts, name, getattr(params, name), found.scaling.get(name), f"scaling_{name}_wrong",
                      f"{name} differs from the model's")
        facts += longrope_factor_facts(params, _factors(found.scaling.get("short_factor")),
                                       _factors(found.scaling.get("long_factor")), "config.json")


def _factors(values: Any) -> np.ndarray | None:
    return None if values is None else np.asarray(values, dtype=np.float32)


def _not_stored(name: str, expected: Any, ref: Reference) -> Fact:
    """A fact the file's format need not store: a note, the reference's value stands."""
    return Fact(name, expected, None, "note", None, f"not in this file — judged from {ref.label}")


def _gguf_scaling(found: Found, params: RopeParameters, context: int, facts: list[Fact]) -> None:
    spec = rope_type_spec(params.rope_type)
    if params.rope_type in GGUF_FREQ_FACTOR_TYPES:
        file_theta = DEFAULT_ROPE_THETA if found.rope_theta is None else found.rope_theta
        facts += frequency_factor_facts(params, found.freq_factors, file_theta, context)
        return
    if spec.switch_length is not None:
        if (found.short_factors is None or found.long_factors is None) \
                and found.scaling.get("rope_type") != params.rope_type:
            facts.append(Fact("rope_factors", f"{params.rope_type} short and long factors", None, "missing",
                              "scaling_missing", f"the {params.rope_type} factor tensors (rope_factors_short/long) "
                                                 "are missing"))
            return
        facts += longrope_factor_facts(params, found.short_factors, found.long_factors, "gguf")
        _fact(facts, "scaling.original_context_length", params.original_max_position_embeddings,
              found.scaling.get("original_max_position_embeddings"), "scaling_original_length_wrong",
              "the original context length differs from the model's", missing_is="note")
        return
    found_type = found.scaling.get("rope_type")
    if found_type is None and spec.scaled and spec.runtime_dependent \
            and params.rope_type not in GGUF_SCALING_TYPES.values():
        # recomputed from the sequence length (dynamic NTK): GGUF cannot state it, llama.cpp cannot run it
        facts.append(Fact("scaling.type", params.rope_type, None, "unchecked", None,
                          f"the model's {params.rope_type} scaling is recomputed at run time past "
                          f"max_position_embeddings ({params.max_position_embeddings}); llama.cpp "
                          f"{RUNTIME_SCALING.says} ({RUNTIME_SCALING.source})"))
        return
    if not spec.scaled:
        if found_type is not None and rope_type_spec(found_type).scaled:
            facts.append(Fact("scaling.type", params.rope_type, found_type, "wrong", "scaling_not_in_model",
                              f"the file scales the frequencies ({found_type}); the model does not"))
        return
    if found_type != params.rope_type:
        facts.append(Fact("scaling.type", params.rope_type, found_type, "missing" if found_type is None else "wrong",
                          "scaling_missing", f"the {params.rope_type} scaling is "
                          + ("missing (no rope.scaling.type)" if found_type is None else f"written as {found_type}")))
        return
    _fact(facts, "scaling.factor", params.factor, found.scaling.get("factor"), "scaling_factor_wrong",
          f"the scaling factor is {found.scaling.get('factor')}; the model's is {params.factor}")
    if "original_max_position_embeddings" in spec.reads:
        _fact(facts, "scaling.original_context_length", params.original_max_position_embeddings,
              found.scaling.get("original_max_position_embeddings"), "scaling_original_length_wrong",
              "the original context length is missing or differs from the model's")
    _yarn_multiplier_fact(found, params, facts)
    if "truncate" in spec.reads and not params.truncate:
        facts.append(Fact("scaling.truncate", False, True, "wrong", "yarn_with_truncate",
                          f"the model's YaRN ramp is not rounded (truncate=false); llama.cpp {YARN_ROUNDING.says} "
                          f"({YARN_ROUNDING.source}): its frequencies differ from the model's"))


def _yarn_multiplier_fact(found: Found, params: RopeParameters, facts: list[Fact]) -> None:
    """YaRN's mscale_all_dim where the file's architecture reads it from rope.scaling.yarn_log_multiplier
    (`llama_cpp.YARN_MULTIPLIER`: DeepSeek-V2/V3, whose converter writes 0.1 x mscale_all_dim): it sets the factor cos
    and sin carry and the softmax's mscale²; absent, llama.cpp's cos and sin carry 0.1 ln(s) + 1."""
    rule = YARN_MULTIPLIER.get(found.architecture or "")
    if rule is None or not params.mscale_all_dim or "mscale_all_dim" not in rope_type_spec(params.rope_type).reads:
        return
    name, want = YARN_MULTIPLIER_KEY.removeprefix("rope."), params.mscale_all_dim * rule.divisor  # as written
    read = found.scaling.get("mscale_all_dim")  # as llama.cpp reads it
    if read is None:
        facts.append(Fact(name, want, None, "missing", "attention_factor_missing",
                          f"{YARN_MULTIPLIER_KEY} is absent: llama.cpp's cos and sin carry 0.1·ln(s) + 1 and the "
                          f"softmax no YaRN mscale; the model's mscale_all_dim is {params.mscale_all_dim:g} "
                          f"({rule.source})"))
        return
    _fact(facts, name, want, read * rule.divisor, "attention_factor_wrong",
          f"{YARN_MULTIPLIER_KEY} gives mscale_all_dim {read:g}; the model's is {params.mscale_all_dim:g} "
          f"({rule.source})")


# what an audit judges: everything ("whole"), or, for a model with RoPE per layer type, the facts of the whole model
# once ("model": sizes but the head's, context, learned positions, ALiBi, the reader's own) and those of one layer
# type's layers in each ("layer": the head size, RoPE, tables)
Part = Literal["whole", "model", "layer"]
SIZES: dict[Part, tuple[str, ...]] = {
    "whole": ("num_heads", "num_kv_heads", "head_dim", "key_length_mla", "hidden_size"),
    "model": ("num_heads", "num_kv_heads", "hidden_size"), "layer": ("head_dim", "key_length_mla")}
SIZE_MISTAKES = {"num_kv_heads": "head_count_wrong", "num_heads": "head_count_wrong",
                 "key_length_mla": "head_dim_wrong"}


def _size_facts(found: Found, ref: Reference, facts: list[Fact], part: Part) -> None:
    expected = expected_sizes(ref, found)  # the reference's, as the file's format and layout state them
    for name in SIZES[part]:
        mine, (want, why) = getattr(found, name), expected.get(name, (None, ""))
        if mine is not None and want is not None:
            _fact(facts, name, want, mine, SIZE_MISTAKES.get(name, f"{name}_wrong"), why)
    if found.context_length is not None and ref.context_length is not None and part != "layer":
        longer = found.context_length > ref.context_length
        written = WRITTEN_CONTEXT.get(found.architecture or "") if found.source == "gguf" else None
        if longer and written is not None and written.length == found.context_length and ref.params is not None \
                and written.reads in rope_type_spec(ref.params.rope_type).reads:
            facts.append(Fact("context_length", ref.context_length, found.context_length, "note", None,
                              f"the converter {written.says} ({written.source})"))
            return
        facts.append(Fact("context_length", ref.context_length, found.context_length,
                          "wrong" if longer else "ok" if found.context_length == ref.context_length else "note",
                          "context_beyond_model" if longer else None,
                          f"the file claims {found.context_length} positions, the model was made for "
                          f"{ref.context_length}" if longer else ""))


def _other_facts(found: Found, ref: Reference, facts: list[Fact]) -> None:
    if found.learned_positions:
        rows = found.learned_positions[0]
        want = ref.learned_positions or ref.context_length
        if want is not None:
            ok = rows >= want
            facts.append(Fact(f"learned positions ({found.learned_name})", want, rows, "ok" if ok else "wrong",
                              None if ok else "learned_table_shorter_than_context",
                              "" if ok else f"the learned table has {rows} rows; the model reads {want} positions"))
    if found.alibi_slopes is not None:
        heads = found.alibi_slopes.shape[0]
        slopes = alibi_slopes(heads)
        ok = same(found.alibi_slopes.reshape(-1).astype(np.float64), slopes, rtol=1e-5)
        facts.append(Fact("alibi_slopes", slopes, found.alibi_slopes, "ok" if ok else "wrong",
                          None if ok else "alibi_slopes_wrong",
                          "" if ok else "the stored slopes are not the paper's for this head count"))


def audit(found: Found, ref: Reference, part: Part = "whole") -> Audit:
    """Every fact of `found` against `ref` (or those of `part`), and the tables they imply up to the context length.
    A file's zero, infinite or NaN values compute without floating-point warnings: they show as infinite errors."""
    with np.errstate(all="ignore"):
        if ref.guessed:
            return _assumed(found, ref, part)
        return _judged(found, ref, part)


def _assumed(found: Found, ref: Reference, part: Part) -> Audit:
    """Against a preset chosen by shape alone: the verdict is the file's against itself; the facts and tables
    against the assumed preset are shown, a difference as a note (another model of that shape may be meant)."""
    own = _judged(found, Reference("none", ref.label), part)
    against = _judged(found, ref, part)
    compared = [_if_assumed(fact, ref) for fact in against.facts[0 if part == "layer" else len(found.facts):]]
    return Audit(found, ref, own.facts + compared, against.divergence, against.implied, against.golden)


def _if_assumed(fact: Fact, ref: Reference) -> Fact:
    if not fact.failing:
        return fact
    assumed = ref.fits[0] if ref.fits else ref.label
    return Fact(fact.name, fact.expected, fact.found, "note", None,
                f"{fact.mistake} if the model is {assumed}: {fact.explanation}" if fact.mistake
                else f"differs from {assumed}: {fact.explanation}")


def _judged(found: Found, ref: Reference, part: Part) -> Audit:
    result = Audit(found, ref, [] if part == "layer" else list(found.facts))
    facts = result.facts
    _size_facts(found, ref, facts, part)
    if part == "model":
        _other_facts(found, ref, facts)
        return result
    if part == "whole":
        _other_facts(found, ref, facts)
    if ref.nope or found.rope_off:
        _switch_facts(found, ref, facts)
        return result
    context = _context(found, ref)
    params = ref.params
    if params is not None and params.table_dim > MAX_DIM:
        raise ParameterError("head_dim", f"the reference's rotary dimension {params.table_dim} is beyond {MAX_DIM}")
    if params is None:  # internal consistency: the file against its own metadata
        if found.source != "config.json" and found.states_frequencies:
            own = _found_params(found, None, facts)
            if own is not None:
                facts.append(Fact("rope_metadata", "RoPE parameters", describe(own), "ok"))
            facts += consistency_facts(found)
        return result
    _rope_facts(found, ref, params, facts)
    result.golden = golden(params, context)
    gold = (result.golden.inv_freq, result.golden.attention_factor)
    if found.caches is not None:
        result.divergence = compare_caches(gold, found.caches.cos, found.caches.sin, context)
        facts += explain_caches(params, found.caches, result.divergence)
        return result
    implied = implied_frequencies(found, ref.params, context, facts)
    if implied is None:
        return result
    result.implied = implied
    result.divergence = compare_frequencies(gold, (implied.inv_freq, implied.attention_factor), context)
    if found.inv_freq is not None:
        facts += _constant_facts(params, implied, result.golden, result.divergence, context)
    return result


def _switch_facts(found: Found, ref: Reference, facts: list[Fact]) -> None:
    """A model whose config switches RoPE off (NoPE), or a file whose runtime applies none (`found.rope_off`): no
    table to compare, only whether both are without positions."""
    if ref.nope and found.rope_off:
        facts.append(Fact("rope", "none", "none", "ok"))
    elif ref.nope and found.source == "gguf" and (found.architecture or "") in ROPE_SWITCH:
        facts.append(Fact("rope", "none", "rotary", "wrong", "rope_not_in_model",
                          f"the model's attention has no positions (its config switches RoPE off); llama.cpp rotates "
                          f"q and k of this file ({ROPE_SWITCH_KEY} absent or true: "
                          f"{ROPE_SWITCH[found.architecture or '']})"))
    elif ref.nope and found.source == "config.json":
        facts.append(Fact("rope", "none", "rotary", "wrong", "rope_not_in_model",
                          "the model's attention has no positions (its config switches RoPE off); this config's "
                          "rotates q and k"))
    elif ref.nope:
        facts.append(Fact("rope", "none", None, "note", None,
                          "the model's attention has no positions (its config switches RoPE off): the file's RoPE "
                          "facts describe no model computation"))
    else:
        facts.append(Fact("rope", "rotary", "none", "wrong", "rope_missing",
                          f"the model rotates q and k; {found.rope_off}"))


def _constant_facts(params: RopeParameters, implied: Frequencies, gold: Frequencies, divergence: Divergence,
                    context: int) -> list[Fact]:
    """The verdict on frequencies the file fixes (an ONNX constant, a checkpoint buffer) and on its factor."""
    freq_ok = same(implied.inv_freq, gold.inv_freq)
    out = []
    if freq_ok or divergence.within_contract:
        out.append(Fact("inv_freq", gold.inv_freq, implied.inv_freq, "ok"))
    else:
        why = explain(params, implied.inv_freq, context)
        found = "".join(f" [{k} = {v}]" for k, v in why.found.items()) if why else ""
        out.append(Fact("inv_freq", gold.inv_freq, implied.inv_freq, "wrong",
                        why.name if why else "frequencies_differ",
                        (why.explanation if why else "the frequencies match no known mistake") + found))
    if not np.isclose(implied.attention_factor, gold.attention_factor, rtol=1e-6):
        out.append(Fact("attention_factor", gold.attention_factor, implied.attention_factor, "wrong",
                        "attention_factor_missing" if implied.attention_factor == 1.0 else "attention_factor_wrong",
                        f"cos and sin carry the factor {implied.attention_factor:g}; the model's is "
                        f"{gold.attention_factor:.6g}"))
    return out
