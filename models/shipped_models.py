"""The shipped model repository beyond the two hand-made geometries: public models' attention configurations.

Each entry holds the attention and position fields of the model's public config.json (copied, never
derived; the rest of the file is left out) and where they were read. `posenc.models.export_onnx.default_specs`
exports each with `spec_from_hf_config`; tests/parity compares each graph with the model's transformers
attention class built from the same dict. Pure data: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


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


_QWEN2_5_7B_INSTRUCT = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
    "num_key_value_heads": 4, "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_scaling": None,
    "sliding_window": 131072, "use_sliding_window": False,
}
_QWEN2_5_URL = "https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json"
# The model card's "Processing Long Texts" block, added to config.json for contexts up to 131,072 tokens.
_QWEN2_5_YARN = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}

_PHI_3_5_LONG_FACTOR = (  # 48 = head_dim 96 / 2
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115,
    1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863,
    4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
    17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156,
    50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457,
    62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
    63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336,
    64.51000213623047, 64.52999877929688, 64.83999633789062,
)

_PHI_3_5_SHORT_FACTOR = (  # 48 = head_dim 96 / 2
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979,
    1.0999999046325684, 1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662,
    1.2899998426437378, 1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
    1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0199997425079346, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533,
    2.729999542236328, 2.749999523162842, 2.8399994373321533,
)

_PHI_3_5_MINI_INSTRUCT = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072, "num_attention_heads": 32,
    "num_key_value_heads": 32, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
    "rope_theta": 10000.0, "sliding_window": 262144,
    "rope_scaling": {"long_factor": list(_PHI_3_5_LONG_FACTOR), "short_factor": list(_PHI_3_5_SHORT_FACTOR),
                     "type": "longrope"},
}

_GEMMA_2B = {
    "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 2048, "num_attention_heads": 8,
    "num_key_value_heads": 1, "head_dim": 256, "max_position_embeddings": 8192, "rope_theta": 10000.0,
}

SHIPPED_MODELS: tuple[ShippedModel, ...] = (
    ShippedModel("qwen2_5_7b_attention", "Qwen/Qwen2.5-7B-Instruct", MappingProxyType(_QWEN2_5_7B_INSTRUCT),
                 _QWEN2_5_URL, "Qwen2Attention"),
    ShippedModel("qwen2_5_7b_yarn_attention", "Qwen/Qwen2.5-7B-Instruct",
                 MappingProxyType({**_QWEN2_5_7B_INSTRUCT, "rope_scaling": _QWEN2_5_YARN}),
                 _QWEN2_5_URL + " and the model card's rope_scaling block for long texts "
                 "(https://huggingface.co/Qwen/Qwen2.5-7B-Instruct#processing-long-texts)",
                 "Qwen2Attention", max_position=131072,
                 notes=("positions up to factor x original_max_position_embeddings = 131072, the model card's "
                        "context length",)),
    ShippedModel("phi3_5_mini_attention", "microsoft/Phi-3.5-mini-instruct", MappingProxyType(_PHI_3_5_MINI_INSTRUCT),
                 "https://huggingface.co/microsoft/Phi-3.5-mini-instruct/blob/main/config.json", "Phi3Attention"),
    ShippedModel("gemma_2b_attention", "google/gemma-2b", MappingProxyType(_GEMMA_2B),
                 "https://huggingface.co/google/gemma-2b/blob/main/config.json", "GemmaAttention"),
)
