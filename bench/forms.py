"""forms: which attention graph onnxruntime runs fastest on this CPU, against torch eager, each alone.

    python -m bench forms                          # the 4 benchmark shapes, 5 rounds (a few minutes on 2 cores)
    python -m bench forms --case rope_attention:8:512 --rounds 3
    python -m bench forms --no-pin                 # every CPU, one thread per CPU

For each case, every side in its own process on the servers' CPUs (bench/isolation.py), the same threads,
timed in bursts, one side at a time, rounds interleaved (a round's value: the fastest call of its burst;
a side's: the median of its rounds):
* torch eager (the module the graphs were exported from: scaled_dot_product_attention);
* onnxruntime, default session options but the threads, on model.onnx (the opset-23 Attention node),
  model.cpu.onnx (GroupQueryAttention) and the forms of posenc.models.export.attention_forms built here from
  model.onnx: unfused MatMul/Softmax/MatMul with a causal mask, the same in 4, 8, 16 and 32 query blocks that skip
  the masked keys, and com.microsoft MultiHeadAttention;
* then, on the fastest of those graphs, session options: no spinning, denormals as zero, basic and extended
  graph optimization instead of all.
Every graph's output is checked against model.onnx's (max |diff|, and the parity tests' tolerances: atol 2e-5,
rtol 1e-4); a form that misses them is reported and never chosen. A second model.onnx process is the control.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from bench.harness import ROOT, Bench, Report, Row, interleaved, log, med, model_config, spread
from bench.inprocess import torch_version
from bench.isolation import AnchorProcess, alone
from posenc.models.export.attention_forms import build_form

CASES = [("rope_attention", 1, 128), ("rope_attention", 4, 256), ("rope_attention", 8, 512),
         ("llama3_1_attention", 1, 1024)]
FORMS = ("unfused", "blocked4", "blocked8", "blocked16", "blocked32", "mha")
OPTIONS: dict[str, tuple[dict[str, str], str | None]] = {
    "no spinning": ({"session.intra_op.allow_spinning": "0"}, None),
    "denormals as zero": ({"session.set_denormal_as_zero": "1"}, None),
    "optimization basic": ({}, "basic"),
    "optimization extended": ({}, "extended"),
}
ATOL, RTOL = 2e-5, 1e-4  # the parity tests' tolerances (tests/parity/test_export.py)
BURST_MS, MOST_CALLS = 400.0, 5


def graph_files(work_dir: Path, model: str) -> dict[str, str]:
    """Every graph of `model` to time: the shipped ones and the forms built from model.onnx (in `work_dir`)."""
    folder = ROOT / "onnx" / model
    files = {"model.onnx": str(folder / "model.onnx")}
    if (folder / "model.cpu.onnx").exists():
        files["model.cpu.onnx"] = str(folder / "model.cpu.onnx")
    attention = model_config(model)["attention"]
    base = onnx.load(str(folder / "model.onnx"))
    for form in FORMS:
        built = build_form(base, form, attention["num_heads"], attention["num_kv_heads"], attention["head_dim"])
        if built is not None:
            path = work_dir / f"{model}.{form}.onnx"
            onnx.save(built, str(path))
            files[form] = str(path)
    return files


def measure(anchors: dict[str, AnchorProcess], key: str, rounds: int) -> dict[str, list[float]]:
    """Per side, the fastest call of its burst in each of the interleaved rounds (calls per burst fitted to
    BURST_MS): other load only ever adds time to a kernel, so the fastest call is its best estimate on a shared
    machine; the table shows the median of the rounds."""
    calls = {}
    for name, anchor in anchors.items():
        first = anchor.burst(1, key)[0]
        calls[name] = max(1, min(MOST_CALLS, int(BURST_MS / max(first, 1e-3))))
    results = interleaved(rounds, *(alone(partial(anchor.burst, calls[name], key), min)
                                    for name, anchor in anchors.items()))
    return dict(zip(anchors, results, strict=True))


def run(bench: Bench) -> Report:
    args = bench.args
    cases = args.case or CASES
    rounds = args.rounds or (2 if args.quick else 5)
    threads, cores = args.threads, bench.cores
    has_torch = torch_version() is not None
    report = Report(notes=[f"# forms: every graph and torch eager alone in its own process, {threads} threads, "
                           f"{rounds} rounds; parity: max |output - model.onnx output|, atol {ATOL} rtol {RTOL}"])
    models = sorted({model for model, _, _ in cases})
    files = {model: graph_files(bench.work_dir, model) for model in models}
    graphs = list(dict.fromkeys(name for model in models for name in files[model]))
    header = ["model", "B", "S", *(["torch eager"] if has_torch else []), *graphs, "fastest graph",
              "torch / fastest", *OPTIONS]
    table = ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    findings: dict[str, dict[str, Any]] = {}
    with ExitStack() as stack:
        def process(name: str) -> AnchorProcess:
            return stack.enter_context(AnchorProcess(name, cores.serve, threads))
        procs = {name: process(name) for name in [*graphs, "model.onnx (control)"]}
        option_procs = {name: process(name) for name in OPTIONS}
        torch_proc = process("torch") if has_torch else None
        for model, batch, seq in cases:
            key = f"{model}:{batch}:{seq}"
            shape = {"model": model, "batch": batch, "seq": seq}
            sides: dict[str, AnchorProcess] = {}
            if torch_proc is not None:
                torch_proc.load("torch", key=key, **shape)
                sides["torch eager"] = torch_proc
            for name in files[model]:
                procs[name].load("ort", key=key, path=files[model][name], **shape)
                sides[name] = procs[name]
            procs["model.onnx (control)"].load("ort", key=key, path=files[model]["model.onnx"], **shape)
            sides["model.onnx (control)"] = procs["model.onnx (control)"]
            reference = procs["model.onnx"].output(key)
            diffs = {name: float(np.abs(side.output(key) - reference).max()) for name, side in sides.items()}
            parity = {name: bool(np.allclose(sides[name].output(key), reference, atol=ATOL, rtol=RTOL))
                      for name in sides}
            times = measure(sides, key, rounds)
            ms = {name: med(values) for name, values in times.items()}
            candidates = [name for name in files[model] if parity[name]]
            fastest = min(candidates, key=lambda name: ms[name])
            # session options on the fastest graph, each in its own process, against that graph again
            option_sides = {fastest: procs[fastest]}
            for name, (config, level) in OPTIONS.items():
                option_procs[name].load("ort", key=key, path=files[model][fastest], options=config, level=level,
                                        **shape)
                option_sides[name] = option_procs[name]
            for name in OPTIONS:
                out = option_procs[name].output(key)
                diffs[f"{fastest}, {name}"] = float(np.abs(out - reference).max())
                parity[name] = bool(np.allclose(out, reference, atol=ATOL, rtol=RTOL))
            option_times = measure(option_sides, key, rounds)
            option_ms = {name: med(values) / med(option_times[fastest]) for name, values in option_times.items()}
            control = ms["model.onnx (control)"] / ms["model.onnx"]
            torch_ms = ms.get("torch eager")
            cells = [model, str(batch), str(seq), *([f"{torch_ms:.2f}"] if torch_ms else []),
                     *(f"{ms[name]:.2f}" + ("" if parity[name] else " (parity!)") if name in ms else "-"
                       for name in graphs),
                     fastest, f"{torch_ms / ms[fastest]:.2f}" if torch_ms else "-",
                     *(f"{option_ms[name]:.2f}x" + ("" if parity[name] else " (parity!)") for name in OPTIONS)]
            table.append("| " + " | ".join(cells) + " |")
            log(table[-1])
            where = f"{model} B={batch} S={seq}"
            if torch_ms:
                for name in ("model.onnx", "model.cpu.onnx", fastest):
                    if name in ms:
                        report.rows.append(Row(f"onnxruntime {name} vs torch eager, alone, {where}", ms[name], torch_ms,
                                               "ms", False, None, spread(times[name], times["torch eager"], False),
                                               control=control))
            findings[key] = {"ms": ms, "max_abs_diff": diffs, "fastest": fastest,
                             "options_relative_to_fastest": option_ms, "control": control}
    report.tables.append("\n".join(table) + "\n\n(milliseconds, median of the rounds; options: time relative to "
                         "the fastest graph with default options, < 1 is faster)")
    all_diffs = {key: {name: f"{diff:.1e}" for name, diff in found["max_abs_diff"].items()}
             for key, found in findings.items()}
    report.notes.append("# forms: max |diff| vs model.onnx: " + json.dumps(all_diffs))
    (bench.work_dir / "forms.json").write_text(json.dumps(findings, indent=2))
    return report
