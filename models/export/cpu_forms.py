"""The CPU forms a model ships beside `model.onnx`, and config.json's record of them.

On the CPU no one graph of a causal attention is fastest everywhere, and which is depends on the CPU
(docs/performance.md): the standard opset-23 `Attention` node (`model.onnx`), onnxruntime's GroupQueryAttention
(`model.cpu.onnx`, `posenc.models.export.cpu_form`) and MatMul/Softmax/MatMul in N query blocks that skip the
masked keys (`model.blocked<N>.onnx`, `posenc.models.export.attention_forms`). Each is written beside
model.onnx and listed in config.json's `cpu_forms` (form, file, sha256, ops); `cpu_rule` names the graph that
runs from each sequence length (`posenc.models.graph_rule`; measured where the model was exported; null: model.onnx
only). The serving machine measures its own rule at start-up (`posenc.service.inference.runtime.calibration`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from posenc.models.export.attention_forms import build_form
from posenc.models.export.cpu_form import op_counts
from posenc.models.graph_rule import GQA_FILE, STANDARD_FILE, Rule, cpu_forms_of, rule_document

# The forms a model ships: GroupQueryAttention, and the query-block counts that were fastest somewhere between
# S=16 and S=1024 on the CPUs measured (4 at short sequences, 16 at long ones)
SHIPPED_FORMS = ("gqa", "blocked4", "blocked8", "blocked16")
# (graph bytes by file, model.onnx first; config.json) -> the rule measured on this machine (`posenc export`
# passes posenc.service.inference.runtime.calibration.measure_rule)
Measure = Callable[[Mapping[str, bytes], Mapping[str, Any]], Rule]


def form_file(form: str) -> str:
    """The file a form is shipped in (GroupQueryAttention keeps the name it has always had)."""
    return GQA_FILE if form == "gqa" else f"model.{form}.onnx"


def write_cpu_forms(folder: Path, measure: Measure | None = None, rule: Sequence[tuple[int, str]] | None = None
                    ) -> list[Path]:
    """Derive every form of SHIPPED_FORMS that `<folder>/model.onnx` has into its own file, list them in config.json
    (`cpu_forms`) with `cpu_rule`: `measure`d here, else `rule`, else null. Stale form files are removed. Returns
    the files written."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    attention = config["attention"]
    heads = (attention["num_heads"], attention["num_kv_heads"], attention["head_dim"])
    standard = (folder / STANDARD_FILE).read_bytes()
    model = onnx.load_from_string(standard)
    config.pop("cpu_model", None)  # the single-form record of earlier exports
    entries, graphs, written = [], {STANDARD_FILE: standard}, []
    for form in SHIPPED_FORMS:
        target = folder / form_file(form)
        built = build_form(model, form, *heads)
        if built is None:
            target.unlink(missing_ok=True)
            continue
        data = built.SerializeToString()
        target.write_bytes(data)
        written.append(target)
        graphs[target.name] = data
        entries.append({"form": form, "file": target.name, "sha256": hashlib.sha256(data).hexdigest(),
                        "ops": dict(sorted(op_counts(built).items()))})
    if entries:
        config["cpu_forms"] = entries
        if measure is not None:
            rule = measure(graphs, config)
        kept = rule is not None and all(file in graphs for _, file in rule)
        config["cpu_rule"] = rule_document(rule) if kept else None
    else:
        config.pop("cpu_forms", None)
        config.pop("cpu_rule", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m posenc.models.export.cpu_forms REPOSITORY...`: (re)derive every model folder's CPU forms, keeping
    the rule config.json records (not measured: `posenc calibrate --write` records this machine's)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("repositories", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for repository in args.repositories:
        for folder in sorted(p for p in repository.iterdir() if (p / STANDARD_FILE).exists()):
            rule = cpu_forms_of(json.loads((folder / "config.json").read_text()))[1]
            written = write_cpu_forms(folder, rule=rule)
            print(f"{folder.name}: " + (", ".join(path.name for path in written) or "no CPU form"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
