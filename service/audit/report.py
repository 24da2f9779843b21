"""An audit as readable text (the CLI) and as a picture of the divergence (`format=png`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from posenc.models.audit.rope_audit import Audit
from posenc.service.tables.png import Curve, Panel, Picture, render

MARKS = {"ok": "ok  ", "wrong": "WRONG", "missing": "MISSING", "note": "note", "unchecked": "-"}


def _value(value: Any) -> str:
    if isinstance(value, dict) and "shape" in value:
        return f"[{'x'.join(str(d) for d in value['shape'])}] {value.get('dtype', '')}".strip()
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def text(doc: dict[str, Any], path: str) -> str:
    """The report as lines: verdict, reference, each fact, the tables' divergence."""
    ref = doc["reference"]
    lines = [f"{path}: {doc['source']} — position handling: {doc['verdict'].upper()}",
             f"reference: {ref['label']}" + (f" (also matched: {', '.join(ref['also_matched'])})"
                                               if ref.get("also_matched") else "")]
    for fact in doc["facts"]:
        line = f"  {MARKS[fact['verdict']]:<7} {fact['name']:<32} expected {_value(fact['expected'])}, " \
               f"found {_value(fact['found'])}"
        if fact["mistake"]:
            line += f"\n          -> {fact['mistake']}: {fact['explanation']}"
        elif fact["explanation"]:
            line += f"\n          ({fact['explanation']})"
        lines.append(line)
    tables = doc.get("tables")
    if tables is not None:
        if tables["within_contract"]:
            lines.append(f"tables: equal to the golden ones within the contract up to position {tables['scanned']} "
                         f"(max error {tables['max_abs_error']:.3g})")
        else:
            first = tables["first_divergent_position"]
            over = ", ".join(f"> {k} from {v}" for k, v in tables["first_position_over"].items() if v is not None)
            lines.append(f"tables: wrong from position {first} on (the dtype's contract); max error "
                         f"{tables['max_abs_error']:.3g} up to {tables['scanned']}"
                         + (f"; error {over}" if over else "")
                         + ("" if tables["missing_from"] is None else
                            f"; no rows from position {tables['missing_from']} on"))
    lines += [f"note: {note}" for note in doc.get("notes", [])]
    return "\n".join(lines)


def picture(result: Audit, path: str) -> bytes:
    """The error of the implied tables against the golden ones per position (binned maxima) and the contract;
    with the frequencies, the file's against the golden ones."""
    doc = result.document()
    panels = []
    tables = doc.get("tables")
    if tables is not None:
        x = np.asarray(tables["bins"]["start"], dtype=np.float64)
        error = np.asarray([float(v) for v in tables["bins"]["max_abs"]])
        tolerance = np.asarray(tables["bins"]["tolerance"])
        title = "within the contract" if tables["within_contract"] else \
            f"wrong from position {tables['first_divergent_position']}"
        panels.append(Panel(f"max |file − golden| of cos/sin per position: {title}", "position", "error",
                            (Curve(x, np.maximum(error, 1e-12), "error", "step"),
                             Curve(x, tolerance, "contract", "line")), logy=True,
                            marks=() if tables["first_divergent_position"] is None
                            else (float(tables["first_divergent_position"]),), mark_label="first divergence"))
    if result.golden is not None and (result.implied is not None or result.found.caches is not None):
        gold = result.golden.inv_freq.astype(np.float64)
        curves = [Curve(np.arange(gold.size), gold, "golden", "points")]
        if result.implied is not None:
            mine = result.implied.inv_freq.astype(np.float64)
            curves.append(Curve(np.arange(mine.size), mine, "file", "points"))
        panels.append(Panel("inverse frequencies", "frequency index", "inv_freq", tuple(curves), logy=True))
    mistakes = ", ".join(doc["mistakes"]) or "none"
    return render(Picture(f"posenc audit {path}: {doc['verdict']} (reference: {doc['reference']['label']}; "
                          f"mistakes: {mistakes})", tuple(panels)))
