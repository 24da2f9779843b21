"""The architecture table's further rows (tests/converters/test_architectures.py runs them with the others): the
converter's further registrations of transformers' rotary architectures, this group the mixtures of experts and their
attention: latent attention (MLA) with a rotary slice of each head, interleaved or not, with and without a DSA indexer,
partial rotary, sliding-window layers over a base of their own or beside layers without positions, NTK-alpha scaling
baked into the base. Each row as the table's: the real model's position settings, one to four layers, a few
experts."""

from __future__ import annotations

import re
from typing import Any

from tests.converters.checkpoints import Model
from tests.converters.matrix import Architecture, Mistake, gguf_base, gguf_size

# MiMo-V2-Flash's partial rotary: 64 of each 192-channel head
_MIMO_PARTIAL = 0.334


def _mimo_hub_config(config: dict[str, Any]) -> dict[str, Any]:
    """MiMo-V2-Flash's config.json as the hub holds it, and the converter reads it: the sliding layers' base as
    swa_rope_theta, their heads under swa_* keys, the layer and expert schedules as hybrid_layer_pattern and
    moe_layer_freq, where transformers 5 saves rope_parameters per layer type, layer_types and mlp_layer_types."""
    hub = {key: value for key, value in config.items()
           if key not in ("rope_parameters", "layer_types", "mlp_layer_types")}
    return {**hub, "rope_theta": 5000000.0, "swa_rope_theta": 10000.0, "partial_rotary_factor": _MIMO_PARTIAL,
            "hybrid_layer_pattern": [0, 1], "moe_layer_freq": [0, 1], "sliding_window": 128,
            "sliding_window_size": 128, "swa_num_attention_heads": 2, "swa_num_key_value_heads": 1,
            "swa_head_dim": 192, "swa_v_head_dim": 128, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
            "layernorm_epsilon": 1e-5}


def _hy_v4_hub_weights(tensors: dict[str, Any]) -> dict[str, Any]:
    """Hy4's tensors as the hub names them, the only names the converter maps: transformers 5's
    `layers.N.hc_pre.hc_{attn,mlp}_layer.X` as `layers.N.hc_{attn,mlp}_layer.hc_pre.X`, `model.hc_pre.hc_head.X` as
    `model.hc_head.X`, and the MLPs' `gate_proj`, which transformers' save turns into `linear_gate` (its
    conversion_mapping's WeightRenaming of `.linear_gate`, meant for the attention's only)."""
    def hub(name: str) -> str:
        name = re.sub(r"\.hc_pre\.(hc_(?:attn|mlp)_layer)\.", r".\1.hc_pre.", name)
        name = re.sub(r"\.mlp\.(shared_experts\.)?linear_gate\.", r".mlp.\1gate_proj.", name)
        return name.replace("model.hc_pre.hc_head.", "model.hc_head.")
    return {hub(name): value for name, value in tensors.items()}


LATENT_ATTENTION_ROWS: list[Architecture] = [
    # GLM-4.7-Flash: MLA, 64 rotary channels of a 256-channel head (192 without positions, 64 with), base 1000000, no
    # scaling, neighbouring channels of the rotary slice paired; experts after a dense first layer (written as
    # llama.cpp's `deepseek2`)
    Architecture(Model("glm4-moe-lite", "Glm4MoeLiteConfig", "Glm4MoeLiteForCausalLM", pre_tokenizer="glm4",
                       config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=2, qk_nope_head_dim=192,
        qk_rope_head_dim=64, kv_lora_rank=32, q_lora_rank=32, v_head_dim=16, intermediate_size=64,
        moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        num_hidden_layers=2, first_k_dense_replace=1, max_position_embeddings=202752, rope_interleave=True,
        pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        gguf="deepseek2", tokenizer="byte-level-chat", mistakes=(gguf_base("deepseek2", 10000.0),)),
    # GLM-5: MLA with a DSA indexer, 64 rotary channels of a 256-channel head, base 8000000, no scaling
    Architecture(Model("glm-moe-dsa", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM", pre_tokenizer="glm4", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=2, qk_nope_head_dim=192,
        qk_rope_head_dim=64, kv_lora_rank=32, q_lora_rank=32, v_head_dim=16, intermediate_size=64,
        moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        num_hidden_layers=2, first_k_dense_replace=1, index_n_heads=2, index_head_dim=64, index_topk=16,
        max_position_embeddings=202752, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 8000000.0})),
        gguf="glm-dsa", tokenizer="byte-level-chat",
        mistakes=(gguf_size("glm-dsa", "rope.dimension_count", 32, "partial_rotary_dim_wrong"),)),
    # Youtu-LLM-2B: dense MLA, 64 rotary channels of a 192-channel head, base 1600000, no scaling, neighbouring
    # channels of the rotary slice paired (written as llama.cpp's `deepseek2`)
    Architecture(Model("youtu", "YoutuConfig", "YoutuForCausalLM", pre_tokenizer="youtu", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=2, qk_nope_head_dim=128,
        qk_rope_head_dim=64, kv_lora_rank=32, q_lora_rank=32, v_head_dim=16, intermediate_size=64,
        num_hidden_layers=1, max_position_embeddings=131072, rope_interleave=True, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 1600000.0})),
        gguf="deepseek2", tokenizer="byte-level", mistakes=(gguf_base("deepseek2", 10000.0),)),
    # MiniMax-M2: half of each 128-channel head rotates (the hub's rotary_dim 64), base 5000000, no scaling, experts
    Architecture(Model("minimax-m2", "MiniMaxM2Config", "MiniMaxM2ForCausalLM", pre_tokenizer="minimax-m2",
                       hub_keys={"rotary_dim": 64}, config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
        max_position_embeddings=196608, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0, "partial_rotary_factor": 0.5})),
        gguf="minimax-m2", tokenizer="byte-level",
        mistakes=(gguf_size("minimax-m2", "rope.dimension_count", 128, "partial_rotary_dim_wrong"),)),
    # MiMo-V2-Flash: a full layer over base 5000000, then sliding layers (128-token window) over base 10000, 64 of
    # each 192-channel head rotated on both (partial_rotary_factor 0.334), experts after the dense first layer;
    # written through the hub's config.json (`_mimo_hub_config`)
    Architecture(Model("mimo-v2-flash", "MiMoV2FlashConfig", "MiMoV2FlashForCausalLM", pre_tokenizer="qwen2",
                       config_json=True, config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=192, v_head_dim=128,
        intermediate_size=64, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
        num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"], mlp_layer_types=["dense", "sparse"],
        sliding_window=129, max_position_embeddings=262144, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 5000000.0,
                               "partial_rotary_factor": _MIMO_PARTIAL},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                  "partial_rotary_factor": _MIMO_PARTIAL}})),
        gguf="mimo2", tokenizer="byte-level", hub_config=_mimo_hub_config,
        mistakes=(Mistake("freq_base_swa overwritten with 5000000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="mimo2.rope.freq_base_swa", value=5000000.0),)),
    # dots.llm1: full attention on every layer (no sliding window in use), 128-channel heads, base 10000000, no
    # scaling, experts after a dense first layer
    Architecture(Model("dots1", "Dots1Config", "Dots1ForCausalLM", pre_tokenizer="qwen2", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=2, head_dim=128,
        intermediate_size=64, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, num_hidden_layers=2, max_position_embeddings=32768, sliding_window=None,
        max_window_layers=62, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0})),
        gguf="dots1", tokenizer="byte-level", mistakes=(gguf_base("dots1", 10000.0),)),
    # Trinity (AFMoE): three sliding-window layers (2048-token window) with RoPE over base 10000, then one full layer
    # without positions, 128-channel heads, 131072 positions, experts after a dense first layer
    Architecture(Model("afmoe", "AfmoeConfig", "AfmoeForCausalLM", pre_tokenizer="afmoe", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        intermediate_size=64, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
        num_dense_layers=1, num_hidden_layers=4, global_attn_every_n_layers=4, sliding_window=2048,
        max_position_embeddings=131072, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="afmoe", tokenizer="byte-level", mistakes=(gguf_base("afmoe", 500000.0),)),
    # Laguna-XS.2: full layers rotate half of each 128-channel head over base 500000, sliding layers (512-token
    # window) all of it over base 10000; query heads of each layer's own (48 full, 64 sliding in the real model)
    Architecture(Model("laguna", "LagunaConfig", "LagunaForCausalLM", pre_tokenizer="laguna", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        intermediate_size=64, moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, num_hidden_layers=2, layer_types=["full_attention", "sliding_attention"],
        mlp_layer_types=["dense", "sparse"], num_attention_heads_per_layer=[2, 4], sliding_window=512,
        max_position_embeddings=131072, gating=True, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}})),
        gguf="laguna", tokenizer="byte-level",
        mistakes=(gguf_size("laguna", "rope.dimension_count", 128, "partial_rotary_dim_wrong"),)),
    # Hy3: RoPE over the whole 128-channel head at base 11158840 (NTK-alpha 1000 over base 10000 baked in: 10000 x
    # 1000^(128/126)), 262144 positions, experts
    Architecture(Model("hy-v3", "HYV3Config", "HYV3ForCausalLM", pre_tokenizer="hunyuan", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        intermediate_size=64, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
        num_hidden_layers=2, max_position_embeddings=262144, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 11158840.0})),
        gguf="hy_v3", tokenizer="byte-level", mistakes=(gguf_base("hy_v3", 10000.0),)),
    # Hy4-preview: MLA with a DSA indexer and hyper-connections, 64 rotary channels of a 256-channel head (neighbouring
    # channels paired), base 10000000, no scaling, 262144 positions; its tensors as the hub names them
    # (`_hy_v4_hub_weights`)
    Architecture(Model("hy-v4", "HYV4Config", "HYV4ForCausalLM", pre_tokenizer="hy_v4", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=2, qk_nope_head_dim=192,
        qk_rope_head_dim=64, kv_lora_rank=32, q_lora_rank=32, v_head_dim=16, intermediate_size=64,
        moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, num_hidden_layers=2,
        index_n_heads=2, index_head_dim=64, index_topk=16, hc_mult=2, max_position_embeddings=262144,
        pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0})),
        gguf="hy_v4", tokenizer="byte-level", hub_weights=_hy_v4_hub_weights,
        mistakes=(gguf_base("hy_v4", 10000.0),)),
]
