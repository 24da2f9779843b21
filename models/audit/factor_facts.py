"""The facts of a scaling's factor tables against the model's: llama3's frequency divisors (a GGUF's `rope_freqs`)
and longrope's short and long factor sets (a GGUF's `rope_factors_short` / `rope_factors_long` tensors, a config.json's
`short_factor` / `long_factor` lists).

Each is judged by the frequencies it implies with the model's base (`divided`), against the golden ones; a set that
holds the other's frequencies is `longrope_short_long_swapped` (a config.json whose lists were exchanged, and the
GGUF or ONNX file a tool writes from it), divisors computed for another base say which base they fit.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from posenc.models.audit.found import Fact
from posenc.models.audit.frequencies import divided, golden, same
from posenc.models.rope_params import RopeParameters
from posenc.models.rope_types import rope_type_spec

SWAPPED = "longrope_short_long_swapped"
# how each kind of file holds the factors: the facts' names and the words for them
HOLDERS = {"gguf": ("rope_factors_{}", "factor tensors (rope_factors_short/long)"),
           "config.json": ("{}_factor", "lists short_factor and long_factor")}


def frequency_factor_facts(params: RopeParameters, factors: np.ndarray | None, file_theta: float,
                           context: int) -> list[Fact]:
    """llama3's divisors (`rope_freqs`) against the model's: missing, ok, or wrong; wrong divisors that are the
    model's scaling computed for the file's own base (`file_theta`, its freq_base) say so."""
    n = params.rotary_dim
    expected = f"{params.rope_type} frequency factors [{n // 2}]"
    if factors is None:
        return [Fact("rope_freqs", expected, None, "missing", "frequency_factors_missing",
                     f"the {params.rope_type} frequency factors (tensor rope_freqs.weight) are missing: the "
                     "frequencies are unscaled")]
    if same(divided(params.rope_theta, n, factors), golden(params, context).inv_freq):
        return [Fact("rope_freqs", expected, factors, "ok")]
    why = f"rope_freqs does not divide the base frequencies into the {params.rope_type} ones"
    if file_theta != params.rope_theta:
        theirs = dataclasses.replace(params, rope_theta=file_theta)
        if same(divided(file_theta, n, factors), golden(theirs, context).inv_freq):
            why = (f"rope_freqs holds the {params.rope_type} factors of base {file_theta:g} (the file's freq_base), "
                   f"not of the model's {params.rope_theta:g}: they were computed from the wrong base too")
    return [Fact("rope_freqs", expected, factors, "wrong", "frequency_factors_wrong", why)]


def longrope_factor_facts(params: RopeParameters, short: np.ndarray | None, long: np.ndarray | None,
                          holder: Literal["gguf", "config.json"]) -> list[Fact]:
    """The short and long factor sets against the model's (each by the frequencies it implies with the model's
    base): ok, missing, exchanged (`longrope_short_long_swapped`) or otherwise wrong (`scaling_factors_wrong`)."""
    switch = rope_type_spec(params.rope_type).switch_length
    if switch is None:
        return []
    length, n = switch(params), params.rotary_dim
    want = {"short": golden(params, length).inv_freq, "long": golden(params, length + 1).inv_freq}
    have = {"short": short, "long": long}
    implied = {k: None if v is None or v.shape != (n // 2,) else divided(params.rope_theta, n, v)
               for k, v in have.items()}
    short_got, long_got = implied["short"], implied["long"]
    swapped = short_got is not None and long_got is not None and same(short_got, want["long"]) \
        and same(long_got, want["short"]) and not same(want["short"], want["long"])
    name, words = HOLDERS[holder]
    facts = []
    for which in ("short", "long"):
        got = implied[which]
        ok = got is not None and same(got, want[which])
        facts.append(Fact(name.format(which), f"{params.rope_type} {which} factors", have[which],
                          "ok" if ok else "wrong" if have[which] is not None else "missing",
                          None if ok else SWAPPED if swapped else "scaling_factors_wrong",
                          "" if ok else f"the short and long {words} are exchanged" if swapped
                          else f"the {which} factors differ from the model's"))
    return facts
