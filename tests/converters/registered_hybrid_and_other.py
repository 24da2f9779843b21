"""The architecture table's further rows (tests/converters/test_architectures.py runs them with the others): the
converter's further registrations of transformers' rotary architectures, this group the hybrids and the rest:
linear-attention and Mamba-2 layers beside attention layers with RoPE, YaRN with an attention factor or Llama-4's
temperature, sliding-window layers over a base of their own or with RoPE where the full layers have none, partial
rotary, recurrent and ternary-weight models, bidirectional encoders, Gemma-4's proportional RoPE. Each row as the
table's: the real model's position settings, one to three layers, a few experts."""

from __future__ import annotations

from typing import Any

from tests.converters.checkpoints import SMALL, Model
from tests.converters.matrix import Architecture, Mistake, gguf_base, gguf_size


def _qwen3_next_hub_weights(tensors: dict[str, Any]) -> dict[str, Any]:
    """Qwen3-Next's tensors as the hub stores them: one multi-token-prediction layer under `mtp.*` beside the model
    (its config.json has no mtp_num_hidden_layers: the converter counts the layers from these tensors and asserts
    there is one). transformers writes none; one is made of the full-attention layer's tensors."""
    import torch

    out = dict(tensors)
    for name, value in tensors.items():
        if name.startswith("model.layers.1."):
            out["mtp.layers.0." + name.removeprefix("model.layers.1.")] = value.clone()
    hidden = tensors["model.norm.weight"]
    out["mtp.fc.weight"] = torch.zeros(hidden.shape[0], 2 * hidden.shape[0], dtype=hidden.dtype)
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{norm}.weight"] = hidden.clone()
    return out


def _bitnet_hub_weights(tensors: dict[str, Any]) -> dict[str, Any]:
    """BitNet's tensors as 1bitLLM/bitnet_b1_58 names its sub-norms (inner_attn_ln, ffn_layernorm), the only names
    the converter maps: transformers' (and microsoft's) attn_sub_norm and ffn_sub_norm stop it ("Can not map tensor
    'model.layers.0.mlp.ffn_sub_norm.weight'")."""
    return {name.replace("self_attn.attn_sub_norm", "self_attn.inner_attn_ln")
            .replace("mlp.ffn_sub_norm", "mlp.ffn_layernorm"): value for name, value in tensors.items()}


def _eurobert_hub_config(config: dict[str, Any]) -> dict[str, Any]:
    """EuroBERT's config.json as the hub holds it (remote code): its pooling as clf_pooling, which the converter does
    not read, where transformers 5 saves classifier_pooling "late" (EuroBertConfig's default), which the converter's
    _try_set_pooling_type refuses ("Unsupported classifier_pooling: late")."""
    config = dict(config)
    config["clf_pooling"] = config.pop("classifier_pooling")
    return config


# the keys of Gemma-4's text_config the hub's config.json (written by transformers 5.10) carries for a dense model,
# which transformers 5.25 does not write
_GEMMA4_HUB_TEXT = {"moe_intermediate_size": None, "num_experts": None, "top_k_experts": None,
                    "enable_moe_block": False, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 512}


def _gemma4_hub_config(config: dict[str, Any]) -> dict[str, Any]:
    """Gemma-4's config.json as the hub holds it: its text_config's expert keys, null for a dense model, without which
    the converter's Gemma4Model.set_gguf_parameters stops at find_hparam(["expert_intermediate_size",
    "moe_intermediate_size"]) (KeyError)."""
    return {**config, "text_config": {**config["text_config"], **_GEMMA4_HUB_TEXT}}


HYBRID_AND_OTHER_ROWS: list[Architecture] = [
    # Qwen3-Next-80B-A3B: Gated DeltaNet layers beside gated full-attention layers whose 256-channel heads rotate a
    # quarter, base 10000000; its tensors with the hub's multi-token-prediction layer (`_qwen3_next_hub_weights`)
    Architecture(Model("qwen3-next", "Qwen3NextConfig", "Qwen3NextForCausalLM", pre_tokenizer="qwen2", config=dict(
        SMALL, head_dim=256, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25})),
        gguf="qwen3next", tokenizer="byte-level", hub_weights=_qwen3_next_hub_weights,
        mistakes=(gguf_size("qwen3next", "rope.dimension_count", 256, "partial_rotary_dim_wrong"),)),
    # Ministral-3-8B's text model: YaRN (factor 16 over 16384 positions, mscale = mscale_all_dim = 1) over base
    # 1000000, 128-channel heads, Llama-4's attention temperature (beta 0.1)
    Architecture(Model("ministral3", "Ministral3Config", "Ministral3ForCausalLM", pre_tokenizer="tekken", config=dict(
        SMALL, head_dim=128, num_hidden_layers=1, max_position_embeddings=262144, pad_token_id=0, bos_token_id=0,
        eos_token_id=0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                         "original_max_position_embeddings": 16384, "max_position_embeddings": 262144,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                         "llama_4_scaling_beta": 0.1})),
        gguf="mistral3", tokenizer="byte-level",
        mistakes=(Mistake("yarn_log_multiplier overwritten with 0", "convert_hf_to_gguf.py",
                          frozenset({"attention_factor_missing"}), key="mistral3.rope.scaling.yarn_log_multiplier",
                          value=0.0),)),
    # Olmo-3-7B: three sliding-window layers (window 4096) to one full layer, base 500000 on both, YaRN (factor 8
    # over 8192 positions, attention factor 1.2079) on the full layers only, 128-channel heads (written as
    # llama.cpp's `olmo2`)
    Architecture(Model("olmo3", "Olmo3Config", "Olmo3ForCausalLM", pre_tokenizer="dbrx", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=4096,
        max_position_embeddings=65536, pad_token_id=0, eos_token_id=0,
        rope_parameters={
            "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                               "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
                               "attention_factor": 1.2079441541679836},
            "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}})),
        gguf="olmo2", tokenizer="byte-level", mistakes=(gguf_base("olmo2", 10000.0),)),
    # K-EXAONE-236B-A23B: three sliding-window layers (window 128) with RoPE to one full layer without, base
    # 1000000, no scaling, 128-channel heads; a dense first layer, then experts
    Architecture(Model("exaone-moe", "ExaoneMoeConfig", "ExaoneMoeForCausalLM", pre_tokenizer="exaone-moe",
                       config=dict(
        SMALL, head_dim=128, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
        sliding_window=128, max_position_embeddings=262144, moe_intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, num_shared_experts=1, first_k_dense_replace=1, pad_token_id=0, bos_token_id=0,
        eos_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        gguf="exaone-moe", tokenizer="byte-level", mistakes=(gguf_base("exaone-moe", 10000.0),)),
    # Cohere North (command-a's mixture of experts): a dense first layer (full attention, RoPE on it), then three
    # sliding-window layers (window 4096) with RoPE to one full layer without, base 50000, 128-channel heads
    Architecture(Model("cohere2-moe", "Cohere2MoeConfig", "Cohere2MoeForCausalLM", pre_tokenizer="cohere2moe",
                       config=dict(
        SMALL, head_dim=128, num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"], prefix_dense_sliding_window_pattern=1,
        prefix_dense_intermediate_size=64, num_experts=4, num_experts_per_tok=2, num_shared_experts=0,
        expert_selection_fn="sigmoid", norm_topk_prob=False, sliding_window=4096, max_position_embeddings=500000,
        rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0, rope_theta=50000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
        gguf="cohere2moe", tokenizer="byte-level", mistakes=(gguf_base("cohere2moe", 10000.0),)),
    # Falcon-H1-7B: attention beside Mamba-2 in every layer, 128-channel heads, base 1e11, a 256K context
    Architecture(Model("falcon-h1", "FalconH1Config", "FalconH1ForCausalLM", pre_tokenizer="falcon-h1", config=dict(
        SMALL, head_dim=128, num_hidden_layers=1, max_position_embeddings=262144, mamba_d_ssm=256, mamba_n_heads=4,
        mamba_d_head=64, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=64, pad_token_id=0, bos_token_id=0,
        eos_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 100000000000.0})),
        gguf="falcon-h1", tokenizer="byte-level", mistakes=(gguf_base("falcon-h1", 10000.0),)),
    # Bamba-9B: Mamba-2 layers with attention layers among them (layers 9, 18 and 27), half of each 128-channel head
    # rotated, base 10000, a 256K context (the converter reads the rotated width only from the hub's
    # `attn_rotary_emb`, which transformers 5 does not write; written as llama.cpp's `granitehybrid`)
    Architecture(Model("bamba", "BambaConfig", "BambaForCausalLM", pre_tokenizer="llama-bpe",
                       hub_keys={"attn_rotary_emb": 64}, config=dict(
        SMALL, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2, attn_layer_indices=[1],
        max_position_embeddings=262144, mamba_n_heads=4, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=64,
        pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
        gguf="granitehybrid", tokenizer="byte-level",
        mistakes=(gguf_size("granitehybrid", "rope.dimension_count", 128, "partial_rotary_dim_wrong"),)),
    # Gemma-3n-E2B's text model: four sliding-window layers (window 512, base 10000) to one full layer (base
    # 1000000), 256-channel heads, a 32K context
    Architecture(Model("gemma3n", "Gemma3nTextConfig", "Gemma3nForCausalLM", config=dict(
        SMALL, head_dim=256, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
        sliding_window=512, max_position_embeddings=32768, vocab_size_per_layer_input=512,
        hidden_size_per_layer_input=16, laurel_rank=8, num_kv_shared_layers=0, activation_sparsity_pattern=[0.95, 0.0],
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})),
        gguf="gemma3n",
        mistakes=(Mistake("freq_base_swa overwritten with 1000000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="gemma3n.rope.freq_base_swa", value=1000000.0),)),
    # granite-swash-2b: a full layer, then three sliding-window layers (window 128) to one full one, RoPE on every
    # layer over base 10000 (no layer_rope_theta), 128-channel heads, attention sinks, an 8K context
    Architecture(Model("granite-swa", "GraniteSWAConfig", "GraniteSWAForCausalLM", pre_tokenizer="gpt-4o", config=dict(
        SMALL, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
        layer_types=["full_attention", "sliding_attention"], sliding_window=128, max_position_embeddings=8192,
        embedding_multiplier=12.0, residual_multiplier=0.28, logits_scaling=10.0, attention_multiplier=0.0078125,
        pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="granite_swa", tokenizer="byte-level", mistakes=(gguf_base("granite_swa", 500000.0),)),
    # granite-swash-3b-a600m: granite-swash's attention (a full layer, then three sliding-window layers of window
    # 128 to one full one, RoPE on every layer over base 10000, attention sinks) over experts beside a shared expert
    Architecture(Model("granitemoe-swa", "GraniteMoeSWAConfig", "GraniteMoeSWAForCausalLM", pre_tokenizer="gpt-4o",
                       config=dict(
        SMALL, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
        layer_types=["full_attention", "sliding_attention"], sliding_window=128, max_position_embeddings=8192,
        num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64, embedding_multiplier=12.0,
        residual_multiplier=0.22, logits_scaling=8.0, attention_multiplier=0.0078125, pad_token_id=0, bos_token_id=0,
        eos_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="granite_swa", tokenizer="byte-level",
        mistakes=(gguf_size("granite_swa", "rope.dimension_count", 64, "partial_rotary_dim_wrong"),)),
    # HRM-Text-1B: two recurrent stacks (H and L, each stack layer's attention called 2 x (3 + 1) times, one KV slot
    # each), 128-channel heads, base 10000, a 4K context
    Architecture(Model("hrm-text", "HrmTextConfig", "HrmTextForCausalLM", pre_tokenizer="llama-bpe", config=dict(
        SMALL, num_attention_heads=2, num_key_value_heads=2, head_dim=128, num_hidden_layers=1, H_cycles=2,
        L_cycles=3, L_bp_cycles=[0, 3], max_position_embeddings=4096, initializer_range=0.025515518153991442,
        embedding_scale=39.191835884530846, prefix_lm=True, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="hrm_text", tokenizer="byte-level", mistakes=(gguf_base("hrm_text", 500000.0),)),
    # AFM-4.5B (Arcee): 128-channel heads, base 10000, YaRN factor 20 over 4096 positions (a 65536-token context)
    Architecture(Model("arcee", "ArceeConfig", "ArceeForCausalLM", pre_tokenizer="llama-bpe", config=dict(
        SMALL, head_dim=128, num_hidden_layers=1, max_position_embeddings=65536, bos_token_id=None, eos_token_id=0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 20.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0})),
        gguf="arcee", tokenizer="byte-level", mistakes=(gguf_base("arcee", 500000.0),)),
    # moe-7b-1b-active-shared-experts (IBM Research): RoPE over the whole head, base 10000, a 4096-token context,
    # experts beside a shared expert (written as llama.cpp's `granitemoe`)
    Architecture(Model("granitemoeshared", "GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM",
                       pre_tokenizer="refact", config=dict(
        SMALL, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64, num_hidden_layers=1,
        max_position_embeddings=4096, eos_token_id=0, bos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="granitemoe", tokenizer="byte-level", mistakes=(gguf_base("granitemoe", 500000.0),)),
    # Jais-2-8B-Chat: 128-channel heads (26 of them over a 3328-wide model), RoPE over the whole head, base 500000,
    # an 8192-token context
    Architecture(Model("jais2", "Jais2Config", "Jais2ForCausalLM", pre_tokenizer="jais-2", config=dict(
        SMALL, head_dim=128, hidden_size=512, num_hidden_layers=1, max_position_embeddings=8192, eos_token_id=0,
        bos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        gguf="jais2", tokenizer="byte-level", mistakes=(gguf_base("jais2", 10000.0),)),
    # bitnet-b1.58-2B-4T: 128-channel heads, base 500000, a 4096-token context, ternary weights; its sub-norms as
    # 1bitLLM's checkpoints name them (`_bitnet_hub_weights`)
    Architecture(Model("bitnet", "BitNetConfig", "BitNetForCausalLM", config=dict(
        SMALL, tie_word_embeddings=True, hidden_size=512, num_hidden_layers=1, max_position_embeddings=4096,
        eos_token_id=2, bos_token_id=1, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        gguf="bitnet", hub_weights=_bitnet_hub_weights, mistakes=(gguf_base("bitnet", 10000.0),)),
    # Mellum2-12B-A2.5B: sliding layers (window 1024) over base 10000, full layers over base 500000, 128-channel
    # heads, a 131072-token context, experts
    Architecture(Model("mellum", "MellumConfig", "MellumForCausalLM", pre_tokenizer="mellum2", config=dict(
        SMALL, head_dim=128, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
        mlp_layer_types=["sparse", "sparse"], sliding_window=1024, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=64, max_position_embeddings=131072, eos_token_id=0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
        gguf="mellum", tokenizer="byte-level",
        mistakes=(Mistake("freq_base_swa overwritten with 500000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="mellum.rope.freq_base_swa", value=500000.0),)),
    # ModernBERT-base, an encoder: global layers (every third) over base 160000, local sliding layers (128-token
    # window) over base 10000, 64-channel heads, an 8192-token context
    Architecture(Model("modernbert", "ModernBertConfig", "ModernBertModel", pre_tokenizer="modern-bert", config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=4, intermediate_size=64, num_hidden_layers=3,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"], local_attention=128,
        max_position_embeddings=8192, pad_token_id=0, eos_token_id=0, bos_token_id=0, cls_token_id=0, sep_token_id=0,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
        gguf="modern-bert", tokenizer="byte-level",
        mistakes=(Mistake("freq_base_swa overwritten with 160000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="modern-bert.rope.freq_base_swa", value=160000.0),)),
    # EuroBERT-210m, a bidirectional encoder: RoPE over the whole 64-channel head, base 250000, an 8192-token
    # context; written through the hub's config.json (`_eurobert_hub_config`)
    Architecture(Model("eurobert", "EuroBertConfig", "EuroBertModel", pre_tokenizer="llama-bpe", config_json=True,
                       config=dict(
        SMALL, num_key_value_heads=4, num_hidden_layers=1, max_position_embeddings=8192, pad_token_id=0,
        eos_token_id=0, bos_token_id=0, mask_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 250000.0})),
        gguf="eurobert", tokenizer="byte-level", hub_config=_eurobert_hub_config,
        mistakes=(gguf_base("eurobert", 10000.0),)),
    # glm-4-9b-hf (GlmForCausalLM, the 8K base model): half of each 128-channel head rotates, base 10000, neighbouring
    # channels paired (written as llama.cpp's `chatglm`)
    Architecture(Model("glm", "GlmConfig", "GlmForCausalLM", pre_tokenizer="chatglm-bpe", config=dict(
        SMALL, hidden_size=512, head_dim=128, num_hidden_layers=1, max_position_embeddings=8192, pad_token_id=0,
        eos_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
        gguf="chatglm", tokenizer="byte-level-chat",
        mistakes=(gguf_size("chatglm", "rope.dimension_count", 128, "partial_rotary_dim_wrong"),)),
    # Gemma-4-12B (unified): five sliding-window layers (window 1024, 256-channel heads, base 10000) to one full layer
    # (512-channel heads, proportional RoPE over a quarter of them, base 1000000), a 256K context, a vision embedder;
    # written through the hub's config.json (`_gemma4_hub_config`)
    Architecture(Model("gemma4-unified", "Gemma4UnifiedConfig", "Gemma4UnifiedForConditionalGeneration", config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                         global_head_dim=512, num_global_key_value_heads=1, attention_k_eq_v=True,
                         final_logit_softcapping=30.0, intermediate_size=64, num_hidden_layers=2,
                         layer_types=["sliding_attention", "full_attention"], sliding_window=1024,
                         max_position_embeddings=262144, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                         rope_parameters={
                             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
        vision_config=dict(patch_size=16, pooling_kernel_size=3, mm_embed_dim=64, mm_posemb_size=16,
                           output_proj_dims=256),
        audio_config=None, boi_token_id=500, eoi_token_id=501, image_token_id=502, video_token_id=503,
        boa_token_id=504, eoa_token_index=505, audio_token_id=506)),
        # the builder claims the class and stops at its per-layer head sizes
        gguf="gemma4", hub_config=_gemma4_hub_config, onnx_refusal="'head_dim' is a per-layer attribute",
        mistakes=(Mistake("freq_base_swa overwritten with 1000000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="gemma4.rope.freq_base_swa", value=1000000.0),)),
]
