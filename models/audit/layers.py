"""A model whose layer types have a RoPE each (Gemma 3 and 4: `full_attention` and `sliding_attention`, as
transformers 5 writes them in `rope_parameters`), judged one layer type at a time.

`audit_model(found, reference)` → `Audit`: for a reference with one RoPE for all layers, `rope_audit.audit`'s;
for one with layer types (`Reference.layers`), a `LayeredAudit`: the facts of the whole model once (sizes, context,
the reader's own), then, for each layer type, the file's facts for its layers (`layer_view`) against that layer
type's reference, with its own tables. The verdict is the worst of the layer types'.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from posenc.models.audit.found import Fact, Found
from posenc.models.audit.reference import Reference
from posenc.models.audit.rope_audit import Audit, audit, verdict_of


def layer_view(found: Found, layer_type: str) -> Found:
    """The facts of the layers of `layer_type`: what the file states for that layer type apart (`found.layers`), else
    what it states for all its layers. The reader's facts and notes stay with the whole file."""
    base = found.layers.get(layer_type, found)
    return replace(base, facts=[], notes=[], layers={}, layer_type=layer_type)


@dataclass
class LayeredAudit(Audit):
    """The verdict on a file of a model with RoPE per layer type. `facts`: those of the whole model; `layers`:
    {layer type: its audit (its facts, its tables)}. A layer type's verdict counts the whole model's facts with its
    own; the file's is the worst of them: "wrong" if any is, "correct" if all are, "unchecked" if all are, else
    "consistent"."""

    layers: dict[str, Audit] = field(default_factory=dict)

    @property
    def failing(self) -> list[Fact]:
        return [f for f in self.facts if f.failing] + [f for layer in self.layers.values() for f in layer.failing]

    def layer_verdict(self, layer_type: str) -> str:
        layer = self.layers[layer_type]
        return verdict_of(self.facts + layer.facts, layer.divergence, layer.reference)

    @property
    def verdict(self) -> str:
        verdicts = {self.layer_verdict(name) for name in self.layers}
        if "wrong" in verdicts:
            return "wrong"
        if verdicts in ({"correct"}, {"unchecked"}):
            return verdicts.pop()
        return "consistent"

    def document(self) -> dict[str, Any]:
        """`Audit.document()`'s keys, `facts` those of the whole model and `tables` None, and `layer_types`: one
        section per layer type (layer_type, verdict, reference, found, facts, mistakes, tables)."""
        out = super().document()  # verdict, mistakes: the properties above, every layer type's
        sections = []
        for name, layer in self.layers.items():
            section = layer.document()
            sections.append({"layer_type": name, "verdict": self.layer_verdict(name),
                             **{key: section[key] for key in ("reference", "found", "facts", "mistakes", "tables")}})
        out["layer_types"] = sections
        return out


def _of_layer(fact: Fact, layer_type: str) -> Fact:
    """A failing fact of one layer type says which layers it is about."""
    if not fact.failing:
        return fact
    return replace(fact, explanation=f"{layer_type} layers: {fact.explanation}" if fact.explanation
                   else f"{layer_type} layers")


def audit_model(found: Found, ref: Reference) -> Audit:
    """`found` against `ref`: one audit, or one per layer type where the reference has layer types."""
    if not ref.layers:
        return audit(found, ref)
    whole = audit(found, ref, "model")
    layers: dict[str, Audit] = {}
    for layer_ref in ref.layers:
        name = str(layer_ref.layer_type)
        layer = audit(layer_view(found, name), layer_ref, "layer")
        layer.facts = [_of_layer(fact, name) for fact in layer.facts]
        layers[name] = layer
    return LayeredAudit(found, ref, whole.facts, layers=layers)
