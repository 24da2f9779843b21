"""An audit as readable text (the CLI) and as a picture of the divergence (`format=png`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc.models.audit.layers import LayeredAudit
from posenc.models.audit.rope_audit import Audit
from posenc.models.diagnosis.rope import angle_steps

MARKS = {"ok": "ok  ", "wrong": "WRONG", "missing": "MISSING", "note": "note", "unchecked": "-"}


def _value(value: Any) -> str:
    if isinstance(value, dict) and "shape" in value:
        return f"[{'x'.join(str(d) for d in value['shape'])}] {value.get('dtype', '')}".strip()
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def text(doc: dict[str, Any], path: str) -> str:
    """The report as lines: verdict, reference, each fact, the tables' divergence; for a model with RoPE per layer
    type, the whole model's facts, then a section per layer type (its verdict, facts and tables)."""
    ref = doc["reference"]
    guessed = ref.get("chosen_by") == "shape"
    lines = [f"{path}: {doc['source']} — position handling: {doc['verdict'].upper()}",
             f"reference: {ref['label']}" + (", assumed by shape (architecture and sizes)" if guessed else "")]
    if guessed:
        lines.append(f"  presets that fit: {', '.join(ref['fits'])}; name the model (--preset NAME or --config "
                     "config.json) for a verdict against it")
    lines += _fact_lines(doc["facts"])
    label = "tables against the assumed preset" if guessed else "tables"
    lines += _tables_lines(doc.get("tables"), label)
    for section in doc.get("layer_types", []):
        lines.append(f"layer type {section['layer_type']}: {section['verdict'].upper()}")
        lines += _fact_lines(section["facts"])
        lines += _tables_lines(section.get("tables"), label)
    lines += [f"note: {note}" for note in doc.get("notes", [])]
    return "\n".join(lines)


def _fact_lines(facts: list[dict[str, Any]]) -> list[str]:
    lines = []
    for fact in facts:
        line = f"  {MARKS[fact['verdict']]:<7} {fact['name']:<32} expected {_value(fact['expected'])}, " \
               f"found {_value(fact['found'])}"
        if fact["mistake"]:
            line += f"\n          -> {fact['mistake']}: {fact['explanation']}"
        elif fact["explanation"]:
            line += f"\n          ({fact['explanation']})"
        lines.append(line)
    return lines


def _tables_lines(tables: dict[str, Any] | None, label: str) -> list[str]:
    if tables is None:
        return []
    if tables["within_contract"]:
        return [f"{label}: equal to the golden ones within the contract up to position {tables['scanned']} "
                f"(max error {tables['max_abs_error']:.3g})"]
    first = tables["first_divergent_position"]
    over = ", ".join(f"> {k} from {v}" for k, v in tables["first_position_over"].items() if v is not None)
    head = f"wrong from position {first} on (the dtype's contract)" if first is not None else \
        f"equal within the contract up to position {tables['scanned']}"
    return [f"{label}: {head}; max error {tables['max_abs_error']:.3g} up to {tables['scanned']}"
            + (f"; error {over}" if over else "")
            + ("" if tables["missing_from"] is None else
               f"; no rows from position {tables['missing_from']} on (context {tables['context_length']})")]


def picture(result: Audit, path: str) -> bytes:
    """The error of the implied tables against the golden ones per position (binned maxima) against the contract,
    rows the file lacks up to the context; beside it the file's frequencies against the golden ones. A model with
    RoPE per layer type: both panels for each layer type."""
    # matplotlib and the tables room only for a picture: `posenc audit FILE` starts without them
    from posenc.service.tables.png import Panel, Picture, render, titled

    doc = result.document()
    panels: list[Panel] = []
    if isinstance(result, LayeredAudit):
        for section in doc["layer_types"]:
            name = section["layer_type"]
            panels += _panels(section.get("tables"), result.layers[name], f"{name}: ")
    else:
        panels += _panels(doc.get("tables"), result, "")
    mistakes = ", ".join(doc["mistakes"]) or "none"
    title = titled(f"posenc audit {path}: {doc['verdict']}", {"reference": doc["reference"]["label"],
                                                               "mistakes": mistakes}, width=100)
    return render(Picture(title, tuple(panels)))


def _panels(tables: dict[str, Any] | None, result: Audit, prefix: str) -> list[Any]:
    """The two panels of one audit's tables (`tables`: its document's) and frequencies, titled with `prefix`."""
    from posenc.service.tables.png import Curve, Panel

    panels = []
    if tables is not None:
        keep = slice(1, None) if len(tables["bins"]["start"]) > 1 else slice(None)  # position 0: no angle, no error
        x = np.maximum(np.asarray(tables["bins"]["start"][keep], dtype=np.float64), 1.0)
        error = np.asarray([float(v) for v in tables["bins"]["max_abs"][keep]])
        tolerance = np.asarray(tables["bins"]["tolerance"][keep])
        first, missing = tables["first_divergent_position"], tables["missing_from"]
        title = "within the contract" if first is None else f"wrong from position {first}"
        curves = [Curve(x, np.maximum(error, 1e-12), "file against golden", "step"),
                  Curve(x, tolerance, "the dtype's contract", "line")]
        if missing is not None:
            title += f", no rows past {missing - 1}"
            curves.append(Curve(np.asarray([missing, tables["context_length"]], dtype=np.float64), np.ones(2),
                                "no row (up to the context length)", "line"))
        marks = tuple(float(max(v, 1)) for v in {first, missing} if v is not None)
        panels.append(Panel(f"{prefix}cos/sin error per position: {title}", "position", "max |file − golden|",
                            tuple(curves), logy=True, logx=True, marks=marks, mark_label="divergence"))
    if result.golden is not None:
        gold = result.golden.inv_freq.astype(np.float64)
        curves = [Curve(np.arange(gold.size), gold, "golden", "points")]
        caches = result.found.caches
        mine = np.zeros(0)
        if result.implied is not None:
            mine = result.implied.inv_freq.astype(np.float64)
        elif caches is not None and caches.cos.ndim == 2 and caches.cos.shape[0] > 1 \
                and caches.cos.shape == caches.sin.shape:
            mine = angle_steps(caches.cos, caches.sin, "half", "half", caches.cos.shape[1])  # the cache's own
        if mine.size:
            curves.append(Curve(np.arange(mine.size), np.abs(mine), "file", "points"))
        of_cache = " (the cache's: its angle step per row)" if result.implied is None else ""
        panels.append(Panel(f"{prefix}inverse frequencies{of_cache}", "frequency index", "inv_freq", tuple(curves),
                            logy=True))
    return panels
