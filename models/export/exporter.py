"""Export `RopeAttention` to ONNX (opset 23) and write a model repository entry.

`onnx/<name>/model.onnx` + `onnx/<name>/config.json`, and the CPU forms derived from it
(`posenc.models.export.cpu_forms`: the causal attention as GroupQueryAttention or in query blocks). The graph takes
query [B, Hq, S, D], key and value [B, Hkv, S, D] float32 and position_ids [B, S] int64 (B and S dynamic)
and returns output [B, Hq, S, D] float32. It is exported with `torch.onnx.export(dynamo=True, opset_version=23)`:
`torch.onnx.ops.rotary_embedding` becomes ONNX `RotaryEmbedding` (one node for q, one for k) and
`scaled_dot_product_attention` becomes one ONNX `Attention` node; `check_fused_graph` refuses a graph
that decomposed either. The only constant is inv_freq [R/2]: cos/sin are computed in the graph from
position_ids (so the file stays a few KB and any position below `max_position` works). longrope graphs
hold both factor sets [2, R/2] and pick one per row (ReduceMax, GreaterOrEqual, GatherND; see
`posenc.models.export.rope_attention`).

Regenerate the shipped repository with `posenc export --defaults --repository onnx`
(or `python -m posenc.models.export.exporter --defaults`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

from posenc.models.errors import ParameterError
from posenc.models.export.arguments import ROPE_OPTIONS, add_export_arguments
from posenc.models.export.cpu_form import op_counts
from posenc.models.export.cpu_forms import Measure, write_cpu_forms
from posenc.models.export.rope_attention import Layout, RopeAttention
from posenc.models.export.shipped_models import SHIPPED_MODELS
from posenc.models.rope import (
    RopeParameters,
    inv_freq_and_attention_factor,
    inv_freq_switch,
    make_rope_parameters,
    rope_parameters_from_config,
)
from posenc.models.rope_types import LLAMA_3_1_ROPE, RUNTIME_DEPENDENT_TYPES

OPSET = 23
IR_VERSION = 10  # onnxruntime 1.30/1.31 refuse IR 14, which onnx 1.23 stamps on new models by default
INPUT_NAMES = ("query", "key", "value", "position_ids")
OUTPUT_NAME = "output"
FUSED_OPS = {"RotaryEmbedding": 2, "Attention": 1}
# Ops that would mean the exporter decomposed attention or the rotation instead of fusing them.
DECOMPOSITION_OPS = {"MatMul", "Softmax", "Einsum", "Neg", "Concat", "Split", "Slice", "Expand", "Where"}

log = logging.getLogger("posenc.export")


class ExportError(RuntimeError):
    """The exporter produced a graph that does not meet the contract (fused ops, dynamic dims)."""


@dataclass(frozen=True)
class ExportSpec:
    """Everything that defines one exported RoPE-attention graph."""

    name: str
    rope: RopeParameters
    num_heads: int
    num_kv_heads: int
    layout: Layout = "half"
    causal: bool = True
    max_batch_size: int = 8
    max_position: int = 4096
    inv_freq_seq_len: int | None = None
    source: dict[str, Any] = field(default_factory=dict)

    def module(self) -> RopeAttention:
        return RopeAttention(
            self.rope, self.num_heads, self.num_kv_heads, layout=self.layout, causal=self.causal,
            inv_freq_seq_len=self.inv_freq_seq_len,
        ).eval()


def default_specs() -> list[ExportSpec]:
    """The shipped repository: a plain MHA graph, a Llama-3.1-8B-shaped GQA graph, and the public models'
    attention of `posenc.models.export.shipped_models` (each from its config.json fields)."""
    plain = make_rope_parameters(head_dim=64, rope_theta=10000.0, max_position_embeddings=4096)
    llama31 = make_rope_parameters(head_dim=128, max_position_embeddings=131072, **LLAMA_3_1_ROPE)
    return [
        ExportSpec("rope_attention", plain, num_heads=8, num_kv_heads=8, max_position=4096),
        ExportSpec("llama3_1_attention", llama31, num_heads=32, num_kv_heads=8, max_position=131072),
        *(spec_from_hf_config(model.config, model.name, max_position=model.max_position, source=model.source())
          for model in SHIPPED_MODELS),
    ]


def frozen_seq_len(rope: RopeParameters, max_position: int) -> int | None:
    """The seq_len a graph freezes inv_freq at: a runtime-dependent type without a single switch (dynamic) at
    the graph's max_position; None for the others (longrope keeps both of its sets and switches per row)."""
    if rope.rope_type in RUNTIME_DEPENDENT_TYPES and inv_freq_switch(rope) is None:
        return max_position
    return None


def spec_from_hf_config(
    config: Mapping[str, Any], name: str, *, layout: Layout = "half", causal: bool = True, max_batch_size: int = 8,
    max_position: int | None = None, source: Mapping[str, Any] | None = None,
) -> ExportSpec:
    """A graph with a Hugging Face model's attention geometry and rope settings (config.json dict).

    Multimodal configs keep the language model in `text_config`; its geometry is used then.
    `max_position` (default: the config's max_position_embeddings) bounds the graph's positions, e.g. the
    context a model card gives for a rope_scaling block it documents; `source` adds provenance to
    config.json's `source`. dynamic freezes inv_freq at seq_len = max_position: the unscaled base, exactly
    what transformers uses for every position the graph accepts (< max_position); longrope keeps its short
    and long factors and switches per row (`posenc.models.export.rope_attention`) — stated in config.json.
    """
    if "num_attention_heads" not in config and isinstance(config.get("text_config"), Mapping):
        config = {**config["text_config"], **{k: v for k, v in config.items() if k == "architectures"}}
    try:
        num_heads = int(config["num_attention_heads"])
    except (KeyError, TypeError, ValueError):
        raise ParameterError("num_attention_heads", "the config must give an integer num_attention_heads") from None
    num_kv_heads = int(config.get("num_key_value_heads") or num_heads)
    rope, info = rope_parameters_from_config(config)
    if max_position is None:
        max_position = int(info.get("max_position_embeddings") or config.get("max_position_embeddings") or 4096)
    described = {"model_type": config.get("model_type"), "architectures": config.get("architectures"),
                 **(source or {})}
    return ExportSpec(name, rope, num_heads, num_kv_heads, layout=layout, causal=causal,
                      max_batch_size=max_batch_size, max_position=max_position,
                      inv_freq_seq_len=frozen_seq_len(rope, max_position),
                      source={k: v for k, v in described.items() if v is not None})


def _example_inputs(spec: ExportSpec) -> tuple[torch.Tensor, ...]:
    # B=2, S=3: sizes > 1 and distinct so torch.export does not specialise the dynamic dims.
    batch, seq, dim = 2, 3, spec.rope.head_dim
    return (
        torch.randn(batch, spec.num_heads, seq, dim),
        torch.randn(batch, spec.num_kv_heads, seq, dim),
        torch.randn(batch, spec.num_kv_heads, seq, dim),
        torch.arange(seq, dtype=torch.int64).repeat(batch, 1),  # [B, S]
    )


def export_model_proto(spec: ExportSpec) -> onnx.ModelProto:
    """Export the spec's module at opset 23 with dynamic B and S; checked by `check_fused_graph`."""
    batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("sequence", min=1)
    tensor_dims = {0: batch, 2: seq}
    dynamic = {"query": tensor_dims, "key": tensor_dims, "value": tensor_dims, "position_ids": {0: batch, 1: seq}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation chatter is not actionable here
        program = torch.onnx.export(
            spec.module(), _example_inputs(spec), dynamo=True, opset_version=OPSET,
            input_names=list(INPUT_NAMES), output_names=[OUTPUT_NAME], dynamic_shapes=dynamic,
            external_data=False, verbose=False, optimize=True,
        )
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    model = program.model_proto
    # stated, not inherited: what torch writes today, and what every onnxruntime the project admits loads
    model.ir_version = IR_VERSION
    check_fused_graph(model)
    return model


def check_fused_graph(model: onnx.ModelProto) -> None:
    """Raise ExportError unless the graph has exactly the fused nodes and dynamic B/S dims."""
    counts = op_counts(model)
    opset = {imp.domain: imp.version for imp in model.opset_import}.get("", 0)
    problems = []
    if opset != OPSET:
        problems.append(f"opset {opset}, expected {OPSET}")
    problems += [f"{n} x {op} (expected {want})" for op, want in FUSED_OPS.items() if (n := counts[op]) != want]
    problems += [f"decomposition op {op}" for op in sorted(DECOMPOSITION_OPS & set(counts))]
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        seq_axis = 1 if value.name == "position_ids" else 2
        if not dims[0].dim_param or not dims[seq_axis].dim_param:
            problems.append(f"{value.name}: batch/sequence dims are not dynamic")
    if problems:
        raise ExportError("exported graph is not the fused RotaryEmbedding + Attention form: " + "; ".join(problems))


def _tensor_entry(name: str, datatype: str, dims: Sequence[int]) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": list(dims)}


def build_config(spec: ExportSpec, model_bytes: bytes, model: onnx.ModelProto) -> dict[str, Any]:
    """config.json: the contract the engine validates the onnxruntime session against."""
    hq, hkv, dim = spec.num_heads, spec.num_kv_heads, spec.rope.head_dim
    inv_freq, attention_factor = inv_freq_and_attention_factor(spec.rope, spec.inv_freq_seq_len)
    rope = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(spec.rope).items()}
    rope.update(layout=spec.layout, inv_freq_seq_len=spec.inv_freq_seq_len, attention_factor_resolved=attention_factor,
                inv_freq=[float(x) for x in inv_freq])
    switch = inv_freq_switch(spec.rope) if spec.inv_freq_seq_len is None else None
    if switch is not None:
        length, second = switch
        rope.update(switch_position=length, inv_freq_switched=[float(x) for x in second])
        rope["note"] = (f"{spec.rope.rope_type}: a row whose largest position is >= {length} uses inv_freq_switched, "
                        "the others inv_freq (transformers decides per batch: max(position_ids) + 1 > "
                        f"{length}; per row, a row's result does not depend on what it is batched with)")
    elif spec.rope.rope_type in RUNTIME_DEPENDENT_TYPES:
        rope["note"] = (f"{spec.rope.rope_type}: inv_freq is frozen at seq_len={spec.inv_freq_seq_len} "
                        "(transformers recomputes it per batch; a static graph cannot)")
    return {
        "name": spec.name,
        "platform": "onnxruntime_onnx",
        "versions": ["1"],
        "max_batch_size": spec.max_batch_size,
        "inputs": [
            _tensor_entry("query", "FP32", [-1, hq, -1, dim]),
            _tensor_entry("key", "FP32", [-1, hkv, -1, dim]),
            _tensor_entry("value", "FP32", [-1, hkv, -1, dim]),
            _tensor_entry("position_ids", "INT64", [-1, -1]),
        ],
        "outputs": [_tensor_entry(OUTPUT_NAME, "FP32", [-1, hq, -1, dim])],
        "attention": {"num_heads": hq, "num_kv_heads": hkv, "head_dim": dim, "causal": spec.causal,
                      "scale": 1.0 / dim**0.5},
        "causal": spec.causal,
        "max_position": spec.max_position,
        "rope": rope,
        "opset": OPSET,
        "ops": dict(sorted(op_counts(model).items())),
        "producer": {"torch": torch.__version__, "onnx": onnx.__version__},
        "source": spec.source,
        "sha256": hashlib.sha256(model_bytes).hexdigest(),
    }


def export(spec: ExportSpec, repository: Path, measure: Measure | None = None) -> Path:
    """Write `<repository>/<name>/model.onnx` and `config.json`; returns the model folder."""
    model = export_model_proto(spec)
    model_bytes = model.SerializeToString()
    folder = Path(repository) / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model_bytes)
    config = build_config(spec, model_bytes, model)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    forms = write_cpu_forms(folder, measure)
    log.info("exported %s (%d bytes%s) to %s", spec.name, len(model_bytes),
             f", and its CPU forms {', '.join(path.name for path in forms)}" if forms else "", folder)
    return folder


def spec_from_args(args: argparse.Namespace) -> ExportSpec:
    """CLI arguments (see `add_export_arguments`) → ExportSpec."""
    if args.from_config:
        config = json.loads(Path(args.from_config).read_text())
        spec = spec_from_hf_config(config, args.name, layout=args.layout, causal=args.causal,
                                   max_batch_size=args.max_batch_size)
        return spec
    rope_kwargs = {k: getattr(args, k) for k in ROPE_OPTIONS if getattr(args, k) is not None}
    rope_kwargs["max_position_embeddings"] = args.max_position
    rope = make_rope_parameters(**rope_kwargs)
    return ExportSpec(args.name, rope, args.num_heads, args.num_kv_heads or args.num_heads, layout=args.layout,
                      causal=args.causal, max_batch_size=args.max_batch_size, max_position=args.max_position,
                      inv_freq_seq_len=frozen_seq_len(rope, args.max_position))


def run_export(args: argparse.Namespace, measure: Measure | None = None) -> list[Path]:
    """Export what the arguments ask for, `measure` timing each model's graphs here (`write_cpu_forms`); returns the
    written model folders."""
    if args.repository is None:
        raise ParameterError("repository", "--repository is required outside a source checkout")
    if args.defaults:
        return [export(spec, args.repository, measure) for spec in default_specs()]
    if not args.name:
        raise ParameterError("name", "--name is required (or use --defaults)")
    return [export(spec_from_args(args), args.repository, measure)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.models.export.exporter",
                                     description=__doc__.splitlines()[0])
    add_export_arguments(parser)
    for folder in run_export(parser.parse_args(argv)):
        print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
