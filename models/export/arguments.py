"""Command-line options of `posenc export` (torch-free, so the CLI can parse before importing torch).

The RoPE scaling options are the fields the rope_type registry says some rope_type reads, with the
type of the matching `RopeParameters` field.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc.models.rope_params import RopeParameters
from posenc.models.rope_types import ROPE_TYPES, SCALING_FIELDS

_ROOT = Path(__file__).resolve().parents[2]  # the checkout: models/export/ -> the top
# The shipped model repository of a source checkout (onnx/ beside pyproject.toml); None in an install.
SOURCE_REPOSITORY: Path | None = _ROOT / "onnx" if (_ROOT / "pyproject.toml").is_file() else None
# max_position_embeddings is the graph's --max-position; everything else some rope_type reads is a flag.
SCALING_OPTIONS: tuple[str, ...] = tuple(sorted(SCALING_FIELDS - {"max_position_embeddings"}))
ROPE_OPTIONS: tuple[str, ...] = ("head_dim", "rope_theta", "rope_type", "partial_rotary_factor", *SCALING_OPTIONS)


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _boolean(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _option_type(field_type: str) -> Callable[[str], Any]:
    """argparse type of a `RopeParameters` field from its annotation (`float | None`, `tuple[float, ...] | None`)."""
    for prefix, parse in (("tuple", _floats), ("bool", _boolean), ("int", int), ("float", float)):
        if field_type.startswith(prefix):
            return parse
    raise TypeError(f"no command-line type for {field_type!r}")


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by `posenc export` and `python -m posenc.models.export.exporter`."""
    # a plain class (`bool`) by its name, a union (`float | None`) as written
    field_types = {f.name: getattr(f.type, "__name__", str(f.type)) for f in dataclasses.fields(RopeParameters)}
    parser.add_argument("--defaults", action="store_true", help="(re)generate the shipped models")
    parser.add_argument("--from-config", metavar="CONFIG_JSON", help="Hugging Face config.json to take geometry from")
    parser.add_argument("--name", help="model name (folder in the repository)")
    parser.add_argument("--repository", type=Path, default=SOURCE_REPOSITORY,
                        help="model repository folder (default: onnx/ of the source checkout)")
    parser.add_argument("--head-dim", type=int, default=64, help="D (default 64)")
    parser.add_argument("--num-heads", type=int, default=8, help="Hq (default 8)")
    parser.add_argument("--num-kv-heads", type=int, help="Hkv; default --num-heads (MHA); a divisor of Hq")
    parser.add_argument("--rope-theta", type=float, help="default 10000")
    parser.add_argument("--rope-type", choices=list(ROPE_TYPES), help="default 'default'")
    parser.add_argument("--partial-rotary-factor", type=float, help="rotated fraction of head_dim (default 1.0)")
    for name in SCALING_OPTIONS:
        readers = ", ".join(rope_type for rope_type, spec in ROPE_TYPES.items() if name in spec.reads)
        parser.add_argument(f"--{name.replace('_', '-')}", type=_option_type(field_types[name]),
                            help=f"rope scaling parameter (transformers name; read by {readers})")
    parser.add_argument("--max-position", type=int, default=4096, help="position_ids must be below this")
    parser.add_argument("--layout", choices=["half", "interleaved"], default="half")
    parser.add_argument("--causal", dest="causal", action="store_true", default=True, help="causal mask (default)")
    parser.add_argument("--bidirectional", dest="causal", action="store_false", help="no mask")
    parser.add_argument("--max-batch-size", type=int, default=8, help="rows per batched run (config.json)")
