"""The architecture table's further rows (tests/converters/test_architectures.py runs them with the others): the
causal LMs of transformers that the issue names beyond its first list, and those onnxruntime-genai's builder lists,
that llama.cpp's converter or the builder writes: mixtures of experts, hybrids whose attention layers carry the RoPE,
YaRN with and without truncation, NTK-alpha scaling, partial rotary. Each row as the table's: the real model's
position settings, its attention sizes where the catalogue has its preset, one or two layers, a few experts."""

from __future__ import annotations

from typing import Any

from tests.converters.checkpoints import SMALL, Model
from tests.converters.matrix import Architecture, Mistake, gguf_base, gguf_size


def _hub_layer_types(config: dict[str, Any]) -> dict[str, Any]:
    """Granite-4's config.json as the hub holds it: transformers 5 saves its `attention` layers as
    `full_attention`, which llama.cpp's converter does not count as attention (it then writes every layer as a
    Mamba-2 layer, without RoPE)."""
    return {**config, "layer_types": ["attention" if kind == "full_attention" else kind
                                      for kind in config["layer_types"]]}


MORE_ARCHITECTURES: list[Architecture] = [
    # DeepSeek-V3 (the catalogue's deepseek-v3): MLA with 128 heads, yarn factor 40 with mscale = mscale_all_dim = 1
    # (the attention factor llama.cpp's deepseek2 graph cancels), q LoRA; its value heads made small (no position
    # setting reads them) to keep the checkpoint under 100 MB
    Architecture(Model("deepseek-v3", "DeepseekV3Config", "DeepseekV3ForCausalLM", preset="deepseek-v3",
                       pre_tokenizer="deepseek-v3", config=dict(
        vocab_size=512, hidden_size=7168, num_attention_heads=128, num_key_value_heads=128, qk_nope_head_dim=128,
        qk_rope_head_dim=64, kv_lora_rank=512, q_lora_rank=64, v_head_dim=16, intermediate_size=64,
        moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        num_hidden_layers=1, first_k_dense_replace=1, max_position_embeddings=163840, bos_token_id=0,
        eos_token_id=0, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                         "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
        gguf="deepseek2", tokenizer="byte-level",
        mistakes=(gguf_size("deepseek2", "rope.dimension_count", 32, "partial_rotary_dim_wrong"),)),
    # gpt-oss-20b (the catalogue's gpt-oss-20b): yarn factor 32 over base 150000 without truncation, sliding and
    # full layers alternating, four experts
    Architecture(Model("gpt-oss", "GptOssConfig", "GptOssForCausalLM", preset="gpt-oss-20b", pre_tokenizer="gpt-4o",
                       config=dict(
        vocab_size=512, hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=128, max_position_embeddings=131072,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096})),
        # llama.cpp rounds YaRN's correction range whatever `truncate` says: its tables are not the model's
        gguf="gpt-oss", onnx=True, tokenizer="byte-level", gguf_divergence=frozenset({"yarn_with_truncate"}),
        mistakes=(Mistake("freq_base overwritten with 10000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base", "yarn_with_truncate"}), key="gpt-oss.rope.freq_base",
                          value=10000.0),)),
    # Nemotron-Mini-4B: half of each 128-channel head rotates
    Architecture(Model("nemotron", "NemotronConfig", "NemotronForCausalLM", config=dict(
        vocab_size=512, hidden_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
        intermediate_size=64, num_hidden_layers=1, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
        gguf="nemotron", onnx=True,
        mistakes=(gguf_size("nemotron", "rope.dimension_count", 128, "partial_rotary_dim_wrong"),)),
    # Hunyuan-7B-Instruct: NTK-alpha scaling (alpha 1000 over base 10000, 128-channel heads), which the converter
    # writes as the base it makes (10000 x 1000^(128/126))
    Architecture(Model("hunyuan-dense", "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", pre_tokenizer="hunyuan",
                       config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
        intermediate_size=64, num_hidden_layers=1, max_position_embeddings=32768, pad_token_id=0,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0})),
        gguf="hunyuan-dense", onnx=True, tokenizer="byte-level",
        mistakes=(gguf_base("hunyuan-dense", 10000.0),)),
    # LFM2-1.2B: short convolutions and attention layers with RoPE, base 1000000
    Architecture(Model("lfm2", "Lfm2Config", "Lfm2ForCausalLM", pre_tokenizer="lfm2", config=dict(
        SMALL, num_hidden_layers=2, layer_types=["conv", "full_attention"], max_position_embeddings=128000,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        gguf="lfm2", onnx=True, tokenizer="byte-level", mistakes=(gguf_base("lfm2", 10000.0),)),
    # LFM2-8B-A1B: LFM2's layers with experts after a dense first layer
    Architecture(Model("lfm2-moe", "Lfm2MoeConfig", "Lfm2MoeForCausalLM", pre_tokenizer="lfm2", config=dict(
        SMALL, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, num_dense_layers=1,
        num_hidden_layers=2, layer_types=["conv", "full_attention"], max_position_embeddings=128000,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        gguf="lfm2moe", onnx=True, tokenizer="byte-level", mistakes=(gguf_base("lfm2moe", 10000.0),)),
    # granite-4.0-micro: GraniteMoeHybrid's class with attention layers only, no experts, RoPE over base 10000000
    # (the converter writes it as llama.cpp's `granite`; the hybrids with Mamba-2 layers are NoPE models, which it
    # writes without RoPE)
    Architecture(Model("granite-4.0-micro", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM",
                       pre_tokenizer="granite-docling", config=dict(
        SMALL, num_local_experts=0, num_experts_per_tok=0, shared_intermediate_size=64, num_hidden_layers=1,
        layer_types=["attention"], position_embedding_type="rope", max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0})),
        gguf="granite", onnx=True, tokenizer="byte-level", hub_config=_hub_layer_types,
        mistakes=(gguf_base("granite", 10000.0),)),
    # Qwen3-30B-A3B: 128-channel heads, base 1000000, experts
    Architecture(Model("qwen3-moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", pre_tokenizer="qwen2", config=dict(
        SMALL, head_dim=128, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
        max_position_embeddings=40960, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        gguf="qwen3moe", tokenizer="byte-level", mistakes=(gguf_base("qwen3moe", 10000.0),)),
    # Qwen1.5-MoE-A2.7B: experts beside a shared expert, base 1000000
    Architecture(Model("qwen2-moe", "Qwen2MoeConfig", "Qwen2MoeForCausalLM", pre_tokenizer="qwen2", config=dict(
        SMALL, moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        num_hidden_layers=1, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        gguf="qwen2moe", tokenizer="byte-level", mistakes=(gguf_base("qwen2moe", 10000.0),)),
    # OLMoE-1B-7B
    Architecture(Model("olmoe", "OlmoeConfig", "OlmoeForCausalLM", pre_tokenizer="olmo", config=dict(
        SMALL, num_key_value_heads=4, num_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
        max_position_embeddings=4096, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="olmoe", tokenizer="byte-level", mistakes=(gguf_base("olmoe", 500000.0),)),
    # Command-R7B: three sliding-window layers with RoPE to one full layer without, base 50000, neighbouring channels
    # paired
    # (the converter reads the hub's `rotary_pct`, which transformers 5 does not write)
    Architecture(Model("cohere2", "Cohere2Config", "Cohere2ForCausalLM", pre_tokenizer="command-r",
                       hub_keys={"rotary_pct": 1.0}, config=dict(
        SMALL, head_dim=64, num_hidden_layers=4, sliding_window=4096, max_position_embeddings=8192,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
        gguf="cohere2", tokenizer="byte-level", mistakes=(gguf_base("cohere2", 10000.0),)),
    # Seed-OSS-36B: 128-channel heads, base 10000000, a 512K context
    Architecture(Model("seed-oss", "SeedOssConfig", "SeedOssForCausalLM", pre_tokenizer="seed-coder", config=dict(
        SMALL, head_dim=128, num_hidden_layers=1, max_position_embeddings=524288,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0})),
        gguf="seed_oss", tokenizer="byte-level", mistakes=(gguf_base("seed_oss", 10000.0),)),
    # ERNIE-4.5-21B-A3B: 128-channel heads, base 500000, experts after a dense first layer
    Architecture(Model("ernie-4.5-moe", "Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", config=dict(
        SMALL, head_dim=128, moe_intermediate_size=64, moe_num_experts=4, moe_k=2, moe_num_shared_experts=1,
        moe_layer_start_index=1, num_hidden_layers=2, max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        gguf="ernie4_5-moe", mistakes=(gguf_base("ernie4_5-moe", 10000.0),)),
    # GLM-4.5-Air: half of each 128-channel head rotates, base 1000000, experts after a dense first layer
    Architecture(Model("glm-4-moe", "Glm4MoeConfig", "Glm4MoeForCausalLM", pre_tokenizer="glm4", config=dict(
        SMALL, head_dim=128, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=1, num_hidden_layers=2, max_position_embeddings=131072, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5})),
        gguf="glm4moe", tokenizer="byte-level-chat",
        mistakes=(gguf_size("glm4moe", "rope.dimension_count", 128, "partial_rotary_dim_wrong"),)),
    # DBRX: base 500000, KV heads in attn_config, experts in ffn_config (transformers' own attention reads the base
    # from attn_config, as the hub's config.json holds it, beside rope_parameters)
    Architecture(Model("dbrx", "DbrxConfig", "DbrxForCausalLM", pre_tokenizer="dbrx", config_json=True, config=dict(
        vocab_size=512, d_model=256, n_heads=4, n_layers=1, max_seq_len=32768,
        attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 500000.0},
        ffn_config={"ffn_hidden_size": 64, "moe_num_experts": 4, "moe_top_k": 2},
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        gguf="dbrx", tokenizer="byte-level", mistakes=(gguf_base("dbrx", 10000.0),)),
    # Qwen3.5's text model: gated-DeltaNet layers beside full-attention layers whose 256-channel heads rotate a
    # quarter, M-RoPE sections [11, 11, 10] interleaved (one position per token in a text model), base 10000000;
    # the converter counts the hub's multi-token-prediction layer (mtp_num_hidden_layers)
    Architecture(Model("qwen3.5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", pre_tokenizer="qwen35",
                       hub_keys={"mtp_num_hidden_layers": 1}, config=dict(
        SMALL, head_dim=256, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True})),
        gguf="qwen35", tokenizer="byte-level", mistakes=(gguf_base("qwen35", 10000.0),)),
    # Qwen3.5's mixture-of-experts text model: the same attention, experts beside a shared expert
    Architecture(Model("qwen3.5-moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", pre_tokenizer="qwen35",
                       hub_keys={"mtp_num_hidden_layers": 1}, config=dict(
        SMALL, head_dim=256, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        max_position_embeddings=262144,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True})),
        gguf="qwen35moe", tokenizer="byte-level", mistakes=(gguf_base("qwen35moe", 10000.0),)),
    # Apertus-8B: llama3 scaling over base 12000000
    Architecture(Model("apertus", "ApertusConfig", "ApertusForCausalLM", pre_tokenizer="tekken", config=dict(
        SMALL, num_hidden_layers=1, max_position_embeddings=65536, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        rope_parameters={"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
        gguf="apertus", tokenizer="byte-level", mistakes=(gguf_base("apertus", 10000.0),)),
    # granite-3.0-1b-a400m: experts, base 10000
    Architecture(Model("granitemoe", "GraniteMoeConfig", "GraniteMoeForCausalLM", config=dict(
        SMALL, num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=1, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="granitemoe", mistakes=(gguf_base("granitemoe", 500000.0),)),
]
