"""Resolved RoPE parameters and their validation (no math beyond resolving defaults).

`RopeParameters` holds exactly the values the inverse-frequency formulas of transformers 5.23
(`transformers/modeling_rope_utils.py`, `ROPE_INIT_FUNCTIONS` and `LlamaRotaryEmbedding` /
`GPTNeoXRotaryEmbedding.compute_default_rope_parameters`) read, after every default has been
applied. `make_rope_parameters` is the one place that validates them; every invalid value raises
`posenc.models.errors.ParameterError` naming the parameter as the API spells it.

Decisions where the reference is silent or fails (docs/ENCODINGS.md §1.1, §1.2):
- odd rotary dim: transformers raises only for a fully rotated odd `head_dim > 4` and otherwise
  silently rotates one channel more than asked (`arange(0, d, 2)` has ceil(d/2) entries). No table
  of `d` channels is consistent with that, so any odd rotary dim is a ParameterError.
- `factor < 1` (given or derived from max/original lengths): ParameterError (transformers warns).
- llama3 `low_freq_factor == high_freq_factor` (Llama 4): built as transformers builds it (no smoothing band), but
  a ParameterError where a frequency's wavelength is exactly original / low_freq_factor (transformers: 0 / 0, NaN).
- `dynamic` needs `rotary_dim > 2` (its exponent d / (d - 2)).
- parameters a rope_type does not read are dropped (transformers ignores them), so two requests
  that produce the same table resolve to the same parameters.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from posenc.models.bounds import DEFAULT_ROPE_THETA, MAX_CONTEXT, MAX_SCALE, MAX_THETA
from posenc.models.errors import ParameterError
from posenc.models.rope_types import (
    DEFAULT_ROPE_TYPE,
    ROPE_TYPES,
    YARN_BETA_FAST_DEFAULT,
    YARN_BETA_SLOW_DEFAULT,
    RopeType,
    RopeTypeSpec,
    rope_type_spec,
)

# Fields whose missing or zero value transformers replaces by a default (`or`, not `is None`).
_OR_DEFAULTS = {"beta_fast": YARN_BETA_FAST_DEFAULT, "beta_slow": YARN_BETA_SLOW_DEFAULT}


@dataclass(frozen=True)
class RopeParameters:
    """Fully resolved RoPE parameters; every field the formulas read.

    `rotary_dim` is the number of rotated channels (`int(head_dim * partial_rotary_factor)` or
    explicit). For `proportional` it is `2 * rope_angles`, while the table still spans `head_dim`
    channels (the remaining frequencies are zero): see `table_dim`.
    """

    head_dim: int
    rotary_dim: int
    rope_theta: float = DEFAULT_ROPE_THETA
    rope_type: RopeType = DEFAULT_ROPE_TYPE
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    alpha: float | None = None
    partial_rotary_factor: float = 1.0

    @property
    def table_dim(self) -> int:
        """Channels of a full-form cos/sin row: head_dim for whole-head rope_types (proportional), else rotary_dim."""
        return ROPE_TYPES[self.rope_type].table_width(self.head_dim, self.rotary_dim)

    @property
    def n_frequencies(self) -> int:
        """Length of inv_freq: table_dim / 2."""
        return self.table_dim // 2

    def as_metadata(self) -> dict[str, str]:
        """Every resolved field that is set, as strings (for safetensors `__metadata__`)."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "truncate" and "truncate" not in ROPE_TYPES[self.rope_type].reads):
                continue
            if isinstance(value, tuple):
                out[f.name] = ",".join(repr(float(v)) for v in value)
            elif isinstance(value, bool):
                out[f.name] = "true" if value else "false"
            else:
                out[f.name] = repr(value) if isinstance(value, float) else str(value)
        return out


def _number(name: str, value: Any, *, minimum: float | None = None, strict: bool = False,
            maximum: float = MAX_SCALE) -> float:
    """A finite real number (bool rejected) <= maximum, optionally bounded below. Integers are compared exactly
    (a 4,000-digit one is out of range, not an OverflowError of its conversion to float)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ParameterError(name, f"must be a finite number, got {_shown(value)}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ParameterError(name, f"must be {'>' if strict else '>='} {minimum}, got {_shown(value)}")
    if value > maximum:
        raise ParameterError(name, f"must be <= {maximum:g}, got {_shown(value)}")
    return float(value)


def _shown(value: Any, limit: int = 40) -> str:
    """`repr(value)` cut to `limit` characters: a 4,000-digit integer is named, not echoed."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _integer(name: str, value: Any, *, minimum: int = 1, maximum: int = MAX_CONTEXT) -> int:
    """An integer (an integral float such as 4096.0 from JSON is accepted) in [minimum, maximum]."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParameterError(name, f"must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise ParameterError(name, f"must be in [{minimum}, {maximum}], got {value}")
    return value


def _factors(name: str, value: Any, length: int) -> tuple[float, ...]:
    """A list of rotary_dim/2 positive numbers (longrope short/long factors)."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ParameterError(name, f"must be a list of numbers, got {value!r}")
    out = tuple(_number(name, v, minimum=0.0, strict=True) for v in value)
    if len(out) != length:
        raise ParameterError(name, f"must have rotary_dim/2 = {length} values, got {len(out)}")
    return out


def _require(rope_type: str, name: str, value: Any) -> Any:
    if value is None:
        raise ParameterError(name, f"is required for rope_type {rope_type!r}")
    return value


def _check_required(rope_type: str, kwargs: dict[str, Any]) -> None:
    """Name every missing field at once, as transformers' KeyError lists every missing key.

    A missing original_max_position_embeddings falls back to max_position_embeddings, and yarn /
    longrope derive a missing factor from max_position_embeddings / original (transformers 5.23).
    """
    spec = ROPE_TYPES[rope_type]
    has = {name for name, value in kwargs.items() if value is not None}
    if "max_position_embeddings" in has:
        has |= {"original_max_position_embeddings"} | ({"factor"} if spec.factor_from_lengths else set())
    missing = [name for name in spec.required if name not in has]
    if missing:
        raise ParameterError(", ".join(missing), f"required for rope_type {rope_type!r}{spec.missing_hint}")


def _resolve_dims(
    head_dim: Any, partial_rotary_factor: Any, rotary_dim: Any, rope_type: str, spec: RopeTypeSpec
) -> tuple[int, int, float]:
    """(head_dim, rotary_dim, partial_rotary_factor) with transformers' `int()` truncation."""
    head = _integer("head_dim", head_dim, minimum=2)
    if rotary_dim is not None and partial_rotary_factor is not None:
        raise ParameterError("rotary_dim", "give either rotary_dim or partial_rotary_factor, not both")
    if rotary_dim is not None:
        rot = _integer("rotary_dim", rotary_dim, minimum=2)
        if rot > head:
            raise ParameterError("rotary_dim", f"must be <= head_dim ({head}), got {rot}")
        prf = rot / head
    else:
        prf = 1.0 if partial_rotary_factor is None else _number(
            "partial_rotary_factor", partial_rotary_factor, minimum=0.0, strict=True
        )
        if prf > 1.0:
            raise ParameterError("partial_rotary_factor", f"must be in (0, 1], got {prf!r}")
        rot = spec.rotated_channels(head, prf)
    if spec.whole_head and head % 2:
        raise ParameterError("head_dim", f"{rope_type} RoPE needs an even head_dim, got {head}")
    if rot % 2:
        raise ParameterError(
            "rotary_dim" if rotary_dim is not None else "partial_rotary_factor",
            f"rotary dim int(head_dim * partial_rotary_factor) = {rot} is odd; RoPE rotates channel pairs",
        )
    if rot < spec.min_rotary_dim:
        raise ParameterError("partial_rotary_factor", f"rotates {rot} channels; at least 2 are needed")
    return head, rot, prf


def _scaling_fields(rope_type: str, v: dict[str, Any], rotary_dim: int) -> dict[str, Any]:
    """The fields of `v` (those the rope_type reads) beyond the lengths and the factor, each checked on its own.

    beta_fast / beta_slow take transformers' `or` defaults, truncate defaults to true, longrope's factor
    lists have rotary_dim/2 values, llama3's frequency factors are positive.
    """
    out: dict[str, Any] = {}
    if v.get("attention_factor") is not None:
        out["attention_factor"] = _number("attention_factor", v["attention_factor"], minimum=0.0)
    for name, default in _OR_DEFAULTS.items():
        if name in v:
            out[name] = _number(name, v[name]) if v[name] else default
    for name in ("mscale", "mscale_all_dim"):
        if v.get(name) is not None:
            out[name] = _number(name, v[name])
    if "truncate" in v:
        truncate = v["truncate"]
        if truncate is not None and not isinstance(truncate, bool):
            raise ParameterError("truncate", f"must be true or false, got {truncate!r}")
        out["truncate"] = True if truncate is None else truncate
    if "alpha" in v:
        out["alpha"] = _number("alpha", _require(rope_type, "alpha", v["alpha"]), minimum=1.0)
    for name in ("short_factor", "long_factor"):
        if name in v:
            out[name] = _factors(name, _require(rope_type, name, v[name]), rotary_dim // 2)
    for name in ("low_freq_factor", "high_freq_factor"):
        if name in v:
            out[name] = _number(name, _require(rope_type, name, v[name]), minimum=0.0, strict=True)
    return out


def make_rope_parameters(**kwargs: Any) -> RopeParameters:
    """Validate and resolve RoPE parameters (API names, transformers 5.23 defaults).

    Accepts the `RopeParameters` field names, with `rotary_dim` optional (derived from
    `partial_rotary_factor`, default 1.0; giving both is an error). Resolution follows
    `standardize_rope_params` and the init functions of `modeling_rope_utils.py`:
    llama3/yarn/longrope take `original_max_position_embeddings` from `max_position_embeddings`
    when absent; yarn/longrope derive a missing `factor` as max / original; yarn's beta_fast /
    beta_slow default to 32 / 1 (also when 0). Raises ParameterError naming the field.
    """
    known = {f.name for f in fields(RopeParameters)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise ParameterError(unknown[0], "is not a RoPE parameter")
    rope_type = kwargs.get("rope_type") or DEFAULT_ROPE_TYPE
    spec = rope_type_spec(rope_type)
    head, rot, prf = _resolve_dims(
        kwargs.get("head_dim"), kwargs.get("partial_rotary_factor"), kwargs.get("rotary_dim"), rope_type, spec
    )
    _check_required(rope_type, kwargs)
    theta_in = kwargs.get("rope_theta")
    theta = DEFAULT_ROPE_THETA if theta_in is None else _number("rope_theta", theta_in, minimum=1.0, strict=True,
                                                                 maximum=MAX_THETA)
    reads = spec.reads
    v = {name: kwargs.get(name) for name in reads}
    out: dict[str, Any] = {
        "head_dim": head, "rotary_dim": rot, "rope_theta": theta, "rope_type": rope_type,
        "partial_rotary_factor": prf,
    }

    max_pos = kwargs.get("max_position_embeddings")
    if max_pos is not None:
        max_pos = _integer("max_position_embeddings", max_pos)
    if spec.original_from_max:
        name = "original_max_position_embeddings"
        orig = v[name] if v[name] is not None else max_pos  # standardize_rope_params' setdefault
        out[name] = _integer(name, _require(rope_type, name, orig))
    if "max_position_embeddings" in reads:
        out["max_position_embeddings"] = _require(rope_type, "max_position_embeddings", max_pos)

    factor = v.get("factor")
    if spec.factor_from_lengths and factor is None and max_pos is not None:
        # transformers derives a missing factor as max / original (yarn and longrope only)
        factor = max_pos / out["original_max_position_embeddings"]
        out["max_position_embeddings"] = max_pos
    if factor is None:
        factor = spec.default_factor
    if "factor" in reads:
        out["factor"] = _number("factor", _require(rope_type, "factor", factor), minimum=1.0)

    out.update(_scaling_fields(rope_type, v, rot))
    params = RopeParameters(**out)
    spec.check(params)
    return params
