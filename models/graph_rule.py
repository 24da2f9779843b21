"""config.json's CPU graphs of a model and the rule that picks one by sequence length (read by the service, written
by the export: `posenc.models.export.cpu_forms`). Plain data, no onnx.

    "cpu_forms": [{"form": "gqa", "file": "model.cpu.onnx", "sha256": "...", "ops": {...}}, ...]
    "cpu_rule": [{"from_sequence": 1, "file": "model.blocked4.onnx"}, {"from_sequence": 363, ...}] or null

A rule is [(from_sequence, file), ...] ascending from 1: each file runs from its length to the next entry's.
Earlier exports recorded one form, `cpu_model` {file, sha256, from_sequence}: read as that form from there on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

STANDARD_FILE = "model.onnx"
GQA_FILE = "model.cpu.onnx"  # the GroupQueryAttention form (POSENC_CPU_FORM_FROM=<length> pins it)
Rule = list[tuple[int, str]]


def valid_rule(rule: Any, files: Sequence[str]) -> Rule | None:
    """`rule` ([[from_sequence, file], ...] or tuples) as a Rule when it is one over `files`; else None."""
    if not isinstance(rule, list | tuple) or not rule:
        return None
    steps = [tuple(step) for step in rule if isinstance(step, list | tuple) and len(step) == 2]
    if len(steps) != len(rule):
        return None
    starts = [start for start, _ in steps]
    if (any(not isinstance(start, int) or isinstance(start, bool) for start in starts) or starts[0] != 1
            or any(later <= earlier for earlier, later in pairwise(starts))
            or any(file not in files for _, file in steps)):
        return None
    return [(int(start), str(file)) for start, file in steps]


def one_form_rule(file: str, start: int) -> Rule:
    """model.onnx below `start`, `file` from it on."""
    return [(1, file)] if start == 1 else [(1, STANDARD_FILE), (start, file)]


def file_for(rule: Sequence[tuple[int, str]], seq: int) -> str:
    """The file `rule` runs a sequence of `seq` on (below 1: the first)."""
    file = rule[0][1]
    for start, later in rule:
        if seq >= start:
            file = later
    return file


def describe(rule: Sequence[tuple[int, str]]) -> str:
    """The rule in words: 'model.blocked4.onnx from 1, model.blocked8.onnx from 363'."""
    return ", ".join(f"{file} from {start}" for start, file in rule)


def rule_document(rule: Sequence[tuple[int, str]] | None) -> list[dict[str, Any]] | None:
    """A rule as config.json's `cpu_rule`."""
    return None if rule is None else [{"from_sequence": start, "file": file} for start, file in rule]


@dataclass(frozen=True)
class CpuForm:
    form: str  # gqa, blocked<N>
    file: str  # in the model's folder
    sha256: str | None


def _file_name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or value in (".", ".."):
        raise ValueError(f"{where} must name a file in the model's folder")
    return value


def cpu_forms_of(config: Mapping[str, Any]) -> tuple[list[CpuForm], Rule | None]:
    """The model's CPU forms and config.json's rule over them and model.onnx (None: not recorded); ValueError
    naming the entry when they are malformed."""
    legacy = config.get("cpu_model")
    if "cpu_forms" not in config and isinstance(legacy, dict):
        file, start = _file_name(legacy.get("file"), "cpu_model"), legacy.get("from_sequence")
        if not (start is None or (isinstance(start, int) and not isinstance(start, bool) and start >= 1)):
            raise ValueError("cpu_model must name a file in the model's folder and a from_sequence >= 1 (or null)")
        form = CpuForm("gqa", file, legacy.get("sha256"))
        return [form], (None if start is None else one_form_rule(file, start))
    entries = config.get("cpu_forms")
    if entries is None:
        return [], None
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise ValueError("cpu_forms must be a list of {form, file, sha256}")
    forms = [CpuForm(str(entry.get("form", "")), _file_name(entry.get("file"), "every cpu_forms entry"),
                     entry.get("sha256")) for entry in entries]
    files = [STANDARD_FILE, *(form.file for form in forms)]
    if len(set(files)) != len(files):
        raise ValueError("cpu_forms must name each file once, and not model.onnx")
    recorded = config.get("cpu_rule")
    if recorded is None:
        return forms, None
    steps = [[step.get("from_sequence"), step.get("file")] if isinstance(step, dict) else None
             for step in recorded] if isinstance(recorded, list) else None
    rule = valid_rule(steps, files)
    if rule is None:
        raise ValueError("cpu_rule must be [{from_sequence, file}, ...] ascending from 1, over model.onnx and "
                         f"the files of cpu_forms ({', '.join(files)}), or null")
    return forms, rule
