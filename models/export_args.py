"""Command-line options of `posenc export` (torch-free, so the CLI can parse before importing torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

# The shipped model repository (onnx/ beside models/).
REPOSITORY_DEFAULT = Path(__file__).resolve().parent.parent / "onnx"
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `posenc export` and `python -m models.export_onnx`."""
    parser.add_argument("--defaults", action="store_true", help="(re)generate the shipped models")
    parser.add_argument("--from-config", metavar="CONFIG_JSON", help="Hugging Face config.json to take geometry from")
    parser.add_argument("--name", help="model name (folder in the repository)")
    parser.add_argument("--repository", type=Path, default=REPOSITORY_DEFAULT, help="model repository folder")
    parser.add_argument("--head-dim", type=int, default=64, help="D (default 64)")
    parser.add_argument("--num-heads", type=int, default=8, help="Hq (default 8)")
    parser.add_argument("--num-kv-heads", type=int, help="Hkv; default --num-heads (MHA); a divisor of Hq")
    parser.add_argument("--rope-theta", type=float, help="default 10000")
    parser.add_argument("--rope-type", choices=ROPE_TYPES, help="default 'default'")
    parser.add_argument("--partial-rotary-factor", type=float, help="rotated fraction of head_dim (default 1.0)")
    for name in ("factor", "low-freq-factor", "high-freq-factor", "attention-factor", "beta-fast", "beta-slow",
                 "mscale", "mscale-all-dim"):
        parser.add_argument(f"--{name}", type=float, help="rope scaling parameter (transformers name)")
    for name in ("short-factor", "long-factor"):
        parser.add_argument(f"--{name}", type=_floats, help="longrope: comma-separated rotary_dim/2 values")
    parser.add_argument("--original-max-position-embeddings", type=int)
    parser.add_argument("--max-position", type=int, default=4096, help="position_ids must be below this")
    parser.add_argument("--layout", choices=["half", "interleaved"], default="half")
    parser.add_argument("--causal", dest="causal", action="store_true", default=True, help="causal mask (default)")
    parser.add_argument("--bidirectional", dest="causal", action="store_false", help="no mask")
    parser.add_argument("--max-batch-size", type=int, default=8, help="rows per batched run (config.json)")
