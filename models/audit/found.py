"""What a file says about its position handling, format-independent, and the verdict on each fact.

A reader (`posenc.service.audit`) fills a `Found` from a GGUF header, an ONNX graph, a safetensors checkpoint
or a config.json; `posenc.models.audit.rope_audit` compares it with a `Reference`. Values are as the file
states them (None: the file does not say); arrays are the few small tensors that carry position facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np

from posenc.models.rope_params import RopeParameters

Verdict = Literal["ok", "wrong", "missing", "note", "unchecked"]
FAILING: frozenset[str] = frozenset({"wrong", "missing"})
# the keys `Found.scaling` may hold: RopeParameters fields but the sizes and base a Found states on its own
SCALING_FIELDS: frozenset[str] = frozenset(f.name for f in fields(RopeParameters)) - {
    "head_dim", "rotary_dim", "rope_theta", "partial_rotary_factor"}
# formats whose position tensors are optional: transformers >= 4.31 keeps inv_freq out of a checkpoint (a
# non-persistent buffer), whose position handling is then all in its config.json
OPTIONAL_POSITION_SOURCES: frozenset[str] = frozenset({"safetensors"})


@dataclass(frozen=True)
class Fact:
    """One position fact: `expected` (the reference's), `found` (the file's), the verdict and, when wrong, the
    known mistake it is (`mistake`, a stable name) with one sentence for the user."""

    name: str
    expected: Any
    found: Any
    verdict: Verdict
    mistake: str | None = None
    explanation: str = ""

    @property
    def failing(self) -> bool:
        return self.verdict in FAILING

    def document(self) -> dict[str, Any]:
        return {"name": self.name, "expected": _plain(self.expected), "found": _plain(self.found),
                "verdict": self.verdict, "mistake": self.mistake, "explanation": self.explanation}


def _plain(value: Any) -> Any:
    """JSON-ready: arrays as short summaries, tuples as lists."""
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        head = [float(v) for v in flat[:4]]
        return {"shape": list(value.shape), "dtype": str(value.dtype), "first": head}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


@dataclass(frozen=True)
class Caches:
    """Precomputed cos/sin tables ([rows, rotary_dim/2], one column per frequency; onnxruntime's cos_cache and
    sin_cache), as stored (their dtype is the contract's)."""

    cos: np.ndarray
    sin: np.ndarray
    interleaved: bool | None = None


@dataclass
class Found:
    """The position facts of one file. `scaling` holds RopeParameters fields as the file states them (its
    `rope_type` a registry name); `inv_freq` frequencies the file fixes directly (an ONNX constant, a
    checkpoint buffer; [2, n] for a short/long pair); `freq_factors` GGUF's rope_freqs divisors;
    `long_factors` / `short_factors` longrope's; `sections` M-RoPE's; `caches` precomputed cos/sin.

    `layers`: {layer type: its facts} where the file states a layer type's RoPE apart (GGUF's `_swa` keys for
    `sliding_attention`, a checkpoint's per-layer-type inv_freq buffers, a config.json's per-layer-type
    rope_parameters); a layer type it does not name runs as the whole file says. In such a Found, `layer_type`
    names its layer type and `inherited` the facts it takes from the other layers because the file does not state
    them for it (llama.cpp gives the sliding layers freq_base when freq_base_swa is absent)."""

    source: str
    architecture: str | None = None
    context_length: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    # the q/k head size of a model with multi-head latent attention stored in llama.cpp's compressed layout (GGUF's
    # attention.key_length_mla; its attention.key_length, `head_dim`, is then the latent's: kv_lora_rank + rope dims)
    key_length_mla: int | None = None
    rotary_dim: int | None = None
    rope_theta: float | None = None
    theta_swa: float | None = None
    scaling: dict[str, Any] = field(default_factory=dict)
    inv_freq: np.ndarray | None = None
    attention_factor: float | None = None
    freq_factors: np.ndarray | None = None
    long_factors: np.ndarray | None = None
    short_factors: np.ndarray | None = None
    sections: tuple[int, ...] | None = None
    caches: Caches | None = None
    interleaved: bool | None = None
    learned_positions: tuple[int, ...] | None = None  # shape of a learned position table (wpe)
    learned_name: str | None = None
    alibi_slopes: np.ndarray | None = None
    facts: list[Fact] = field(default_factory=list)  # facts the reader judged itself (config.json warnings)
    notes: list[str] = field(default_factory=list)
    layer_type: str | None = None
    inherited: tuple[str, ...] = ()
    layers: dict[str, Found] = field(default_factory=dict)
    rope_off: str | None = None  # the runtime applies no RoPE at all, and why (a GGUF's switch: llama_cpp.ROPE_SWITCH)

    @property
    def states_frequencies(self) -> bool:
        """Whether the file states anything a runtime computes its frequencies from: a base, a rotary dimension,
        scaling, a constant, factors or caches."""
        stated = (self.rope_theta, self.rotary_dim, self.inv_freq, self.freq_factors, self.long_factors,
                  self.short_factors, self.caches)
        return bool(self.scaling) or any(value is not None for value in stated)

    def summary(self) -> dict[str, Any]:
        """The scalar facts as read (arrays by shape), for the report."""
        out: dict[str, Any] = {"source": self.source}
        for name in ("architecture", "context_length", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                     "key_length_mla", "rotary_dim", "rope_theta", "theta_swa", "attention_factor", "sections",
                     "interleaved", "learned_positions", "learned_name"):
            value = getattr(self, name)
            if value is not None:
                out[name] = _plain(value)
        if self.scaling:
            out["scaling"] = {k: _plain(v) for k, v in self.scaling.items()}
        for name in ("inv_freq", "freq_factors", "long_factors", "short_factors", "alibi_slopes"):
            value = getattr(self, name)
            if value is not None:
                out[name] = _plain(value)
        if self.caches is not None:
            out["caches"] = {"shape": list(self.caches.cos.shape), "dtype": str(self.caches.cos.dtype)}
        if self.inherited:
            out["inherited"] = list(self.inherited)
        if self.layers:
            out["layer_types"] = {name: {k: v for k, v in layer.summary().items() if k != "source"}
                                  for name, layer in self.layers.items()}
        return out
