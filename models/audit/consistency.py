"""A file without a reference, checked against itself: its factor tensors, sections, constants and caches
against its own rotary dimension, and its caches against plain RoPE of the base their two highest frequencies
show (a note either way: a scaled cache is no mistake without a reference that says otherwise)."""

from __future__ import annotations

import numpy as np

from posenc.models.audit.divergence import compare_caches
from posenc.models.audit.found import Fact, Found
from posenc.models.audit.frequencies import plain, same, theta_of
from posenc.models.diagnosis.rope import angle_steps


def _length(name: str, array: np.ndarray, half: int, mistake: str) -> Fact:
    ok = array.shape[-1] == half and bool(np.all(np.isfinite(array)))
    return Fact(name, f"{half} finite values (rotary_dim / 2)", array, "ok" if ok else "wrong",
                None if ok else mistake, "" if ok else f"{name} does not hold one finite value per frequency")


def _base_note(name: str, theta: float | None, plain_rope: bool) -> Fact:
    if theta is not None and plain_rope:
        return Fact(name, "one RoPE table", f"plain RoPE, base {theta:g}", "note")
    return Fact(name, "one RoPE table", "not plain RoPE of one base", "note", None,
                "scaled, or another mistake: name the model (--preset or --config) to judge it")


def consistency_facts(found: Found) -> list[Fact]:
    out: list[Fact] = []
    rotary, head = found.rotary_dim, found.head_dim
    if rotary is not None and head is not None and rotary > head:
        out.append(Fact("rotary_dim", f"<= head_dim {head}", rotary, "wrong", "partial_rotary_dim_wrong",
                        "the file rotates more channels than a head has"))
    half = rotary // 2 if rotary else None
    for name, array in (("rope_freqs", found.freq_factors), ("rope_factors_long", found.long_factors),
                        ("rope_factors_short", found.short_factors), ("inv_freq", found.inv_freq)):
        if array is not None and half:
            out.append(_length(name, array, half, "frequency_factors_wrong" if name != "inv_freq"
                               else "partial_rotary_dim_wrong"))
    if found.sections is not None and half:
        ok = sum(found.sections) <= half
        out.append(Fact("mrope_sections", f"sum <= {half}", found.sections, "ok" if ok else "wrong",
                        None if ok else "mrope_sections_wrong", "" if ok else "the sections cover more frequencies "
                                                                               "than the rotary dimension has"))
    if found.inv_freq is not None and found.inv_freq.ndim == 1 and found.inv_freq.size >= 2:
        theta = theta_of(found.inv_freq, 2 * found.inv_freq.size)
        out.append(_base_note("inv_freq base", theta, theta is not None and same(
            found.inv_freq, plain(theta, 2 * found.inv_freq.size))))
    caches = found.caches
    if caches is not None:
        columns = caches.cos.shape[1]
        if half and columns != half:
            out.append(Fact("cache columns", half, columns, "wrong", "partial_rotary_dim_wrong",
                            "the caches have another number of columns than rotary_dim / 2"))
        elif caches.cos.shape[0] > 1:
            steps = angle_steps(caches.cos, caches.sin, "half", "half", columns)
            theta = theta_of(steps.astype(np.float32), 2 * columns)
            fits = theta is not None and compare_caches((plain(theta, 2 * columns), 1.0), caches.cos, caches.sin,
                                                        caches.cos.shape[0]).within_contract
            out.append(_base_note("cache base", theta, fits))
    return out
