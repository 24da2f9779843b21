"""Shared fixtures of the RoPE tests: transformers 5.23 reference calls, tolerances, model-shaped configs.

The configs below are shaped like the public config.json of the named models (field names, head sizes,
thetas, lengths, scaling dicts). Phi-3's short/long factor lists are synthetic (48 increasing values):
the tests only need their shape and the switch between them.
"""

from typing import Any

import numpy as np
import torch
import transformers
from transformers import AutoConfig, LlamaConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

transformers.logging.set_verbosity_error()

# Precision contract (docs/ENCODINGS.md, top): inv_freq is transformers' float32 computation, so it must match
# within 2 ulp (rtol 3e-7). cos/sin are evaluated in float64 from that inv_freq while transformers multiplies
# position x inv_freq in float32 (angle error ~|angle| * 6e-8), hence the angle-proportional term.
INV_FREQ_MAX_ULP = 2
INV_FREQ_RTOL = 3e-7
COS_SIN_ATOL = 2e-6
COS_SIN_ANGLE_RTOL = 4e-7


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """Largest distance in float32 units in the last place between two float32 arrays."""
    ia = a.astype(np.float32).view(np.int32).astype(np.int64)
    ib = b.astype(np.float32).view(np.int32).astype(np.int64)
    return int(np.abs(ia - ib).max()) if ia.size else 0


def assert_inv_freq_close(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert ulp_distance(ours, ref) <= INV_FREQ_MAX_ULP
    np.testing.assert_allclose(ours, ref, rtol=INV_FREQ_RTOL, atol=0)


def cos_sin_tolerance(positions: np.ndarray, inv_freq: np.ndarray, attention_factor: float) -> np.ndarray:
    """Per-element bound [rows, d/2] of the precision contract."""
    angles = np.abs(positions.astype(np.float64)[:, None] * inv_freq.astype(np.float64)[None, :])  # [rows, d/2]
    return (COS_SIN_ATOL + COS_SIN_ANGLE_RTOL * angles) * max(1.0, attention_factor)


def llama_config(rope_parameters: dict[str, Any], head_dim: int, max_position_embeddings: int) -> LlamaConfig:
    """A one-layer LlamaConfig carrying `rope_parameters` (v5 form)."""
    return LlamaConfig(
        hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim, num_hidden_layers=1,
        intermediate_size=8, vocab_size=8, max_position_embeddings=max_position_embeddings,
        rope_parameters=dict(rope_parameters),
    )


def rotary_module(config: Any) -> torch.nn.Module:
    """LlamaRotaryEmbedding; for "default" GPT-NeoX's, whose default init honours partial_rotary_factor."""
    if config.rope_parameters["rope_type"] == "default":
        return GPTNeoXRotaryEmbedding(config)
    return LlamaRotaryEmbedding(config)


def forward_cos_sin(module: torch.nn.Module, positions: np.ndarray, layer_type: str | None = None,
                    dtype: torch.dtype = torch.float32) -> tuple[np.ndarray, np.ndarray]:
    """module(x, position_ids) for one batch row → cos, sin [rows, d] as float32 numpy."""
    x = torch.zeros(1, dtype=dtype)
    position_ids = torch.as_tensor(positions, dtype=torch.int64)[None, :]  # [1, rows]
    args = (x, position_ids) if layer_type is None else (x, position_ids, layer_type)
    cos, sin = module(*args)
    return cos[0].float().numpy(), sin[0].float().numpy()


# --- model-shaped config.json objects -----------------------------------------------------------------

PHI3_SHORT = [round(1.0 + 0.02 * i, 4) for i in range(48)]
PHI3_LONG = [round(1.0 + 1.25 * i, 4) for i in range(48)]

MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
        "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    },
    "qwen2-7b": {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584,
        "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rope_scaling": None,
    },
    "qwen2.5-7b-yarn": {
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0,
        "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
    },
    "phi-3-mini-128k": {
        "model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072,
        "num_attention_heads": 32, "num_key_value_heads": 32, "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG},
    },
    "deepseek-v3-yarn": {
        "model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128, "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128, "v_head_dim": 128, "max_position_embeddings": 163840, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
    },
    "deepseek-v2-lite-yarn": {
        "model_type": "deepseek_v3", "hidden_size": 2048, "num_attention_heads": 16, "qk_rope_head_dim": 64,
        "max_position_embeddings": 163840, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                         "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
    },
    "gemma-4-proportional": {
        "model_type": "gemma4_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
        "global_head_dim": 512, "num_hidden_layers": 6, "max_position_embeddings": 131072,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    },
    "llama-3.1-8b-v5": {
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    },
    "neox-partial-dynamic": {
        "model_type": "llama", "hidden_size": 2560, "num_attention_heads": 32, "max_position_embeddings": 4096,
        "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
        "rope_scaling": {"type": "dynamic", "factor": 2.0},
    },
}

ROTARY_CLASSES: dict[str, type[torch.nn.Module]] = {
    "llama": LlamaRotaryEmbedding,
    "qwen2": Qwen2RotaryEmbedding,
    "phi3": Phi3RotaryEmbedding,
    "deepseek_v3": DeepseekV3RotaryEmbedding,
    "gemma4_text": Gemma4TextRotaryEmbedding,
}


def hf_model_rotary(config_json: dict[str, Any]) -> torch.nn.Module:
    """The model's own rotary embedding, built from the config.json via its config class."""
    kwargs = {k: v for k, v in config_json.items() if k != "model_type"}
    config = AutoConfig.for_model(config_json["model_type"], **kwargs)
    return ROTARY_CLASSES[config_json["model_type"]](config)
