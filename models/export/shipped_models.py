"""The shipped model repository beyond the two hand-made geometries: public models' attention configurations.

Each entry holds the attention and position fields of the model's public config.json (copied, never
derived; the rest of the file is left out) and where they were read. `posenc.models.export.exporter.default_specs`
exports each with `spec_from_hf_config`; tests/parity compares each graph with the model's transformers
attention class built from the same dict. Pure data: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from posenc.models.presets import find_preset


@dataclass(frozen=True)
class ShippedModel:
    """One graph of the repository: folder name, public model id, its config.json fields, provenance.

    max_position: the graph's position bound when it is not the config's max_position_embeddings (a
    rope_scaling block the model card documents extends the context beyond it); attention_class: the
    transformers attention class of the model (the parity reference).
    """

    name: str
    model_id: str
    config: Mapping[str, Any]
    read_from: str
    attention_class: str
    max_position: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def source(self) -> dict[str, Any]:
        """config.json's `source`: where the graph's geometry and rope settings come from."""
        return {"model_id": self.model_id, "read_from": self.read_from, **({"notes": list(self.notes)} if self.notes
                                                                           else {})}


def _attention_config(preset: str, **attention: Any) -> Mapping[str, Any]:
    """The model's config.json fields: its position facts from the preset catalogue (their one home,
    `posenc.models.presets`, with where each was read), and the attention fields a preset leaves out."""
    return MappingProxyType({**find_preset(preset).config, **attention})


_QWEN2_5_ATTENTION = {"architectures": ["Qwen2ForCausalLM"], "num_key_value_heads": 4, "sliding_window": 131072,
                      "use_sliding_window": False}
_QWEN2_5_URL = "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json"

SHIPPED_MODELS: tuple[ShippedModel, ...] = (
    ShippedModel("qwen2_5_7b_attention", "Qwen/Qwen2.5-7B-Instruct",
                 _attention_config("qwen2.5-7b-instruct", rope_scaling=None, **_QWEN2_5_ATTENTION),
                 _QWEN2_5_URL, "Qwen2Attention"),
    ShippedModel("qwen2_5_7b_yarn_attention", "Qwen/Qwen2.5-7B-Instruct",
                 _attention_config("qwen2.5-7b-instruct-yarn", **_QWEN2_5_ATTENTION),
                 _QWEN2_5_URL + " and the model card's rope_scaling block for long texts "
                 "(https://huggingface.co/Qwen/Qwen2.5-7B-Instruct#processing-long-texts)",
                 "Qwen2Attention", max_position=131072,
                 notes=("positions up to factor x original_max_position_embeddings = 131072, the model card's "
                        "context length",)),
    ShippedModel("phi3_5_mini_attention", "microsoft/Phi-3.5-mini-instruct",
                 _attention_config("phi-3.5-mini-instruct", architectures=["Phi3ForCausalLM"], num_key_value_heads=32,
                                   sliding_window=262144),
                 "https://huggingface.co/microsoft/Phi-3.5-mini-instruct/blob/main/config.json", "Phi3Attention"),
    ShippedModel("gemma_2b_attention", "google/gemma-2b",
                 _attention_config("gemma-2b", architectures=["GemmaForCausalLM"], num_key_value_heads=1),
                 "https://huggingface.co/google/gemma-2b/blob/main/config.json", "GemmaAttention"),
)
