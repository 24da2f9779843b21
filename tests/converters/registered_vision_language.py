"""The architecture table's further rows (tests/converters/test_architectures.py runs them with the others): the
converter's further registrations of transformers' rotary architectures, this group the vision-language composites
(and Chameleon's early fusion) whose text model llama.cpp's converter writes: M-RoPE sections over the whole head or a
part of it, interleaved or not, llama3 scaling on sliding layers, partial rotary beside sparse-attention layers. Each
row as the table's: the real model's position settings, one or two layers, a few experts, a one-layer vision
tower (Chameleon's: a small VQ image tokenizer)."""

from __future__ import annotations

from typing import Any

from tests.converters.checkpoints import Model
from tests.converters.matrix import Architecture, Mistake, gguf_base, gguf_size


def _minimax_m3_hub_config(config: dict[str, Any]) -> dict[str, Any]:
    """MiniMax-M3's text_config as the hub's config.json holds it, and the converter reads it: the sparse-attention
    and expert schedules (sparse_attention_config, moe_layer_freq) that transformers 5 folds into layer_types and
    mlp_layer_types, a shared expert and sigmoid routing."""
    text = dict(config["text_config"])
    text.update(sparse_attention_config={
        "sparse_num_index_heads": text["index_n_heads"], "sparse_index_dim": text["index_head_dim"],
        "sparse_block_size": text["index_block_size"], "sparse_topk_blocks": text["index_topk_blocks"],
        "sparse_local_block": text["index_local_blocks"], "sparse_attention_freq": [0, 1]},
        moe_layer_freq=[0, 1], n_shared_experts=1, scoring_func="sigmoid")
    return {**config, "architectures": ["MiniMaxM3SparseForConditionalGeneration"], "text_config": text}


def _step3p7_hub_config(config: dict[str, Any]) -> dict[str, Any]:
    """Step-3.7-Flash's text_config as the hub's config.json holds it, and the converter reads it: rope_theta and
    partial_rotary_factors as lists, one entry a layer, the full layers' llama3 scaling as rope_scaling with
    yarn_only_types, and Step-3.5's key names (num_attention_groups, moe_num_experts, moe_top_k, moe_layers_enum,
    attention_other_setting), where transformers 5 saves rope_parameters per layer type."""
    saved = config["text_config"]
    text = {key: value for key, value in saved.items() if key not in ("rope_parameters", "per_layer_config")}
    rope = saved["rope_parameters"]
    kinds = text["layer_types"]
    text.update(rope_theta=[rope[kind]["rope_theta"] for kind in kinds],
                partial_rotary_factors=[rope[kind].get("partial_rotary_factor", 1.0) for kind in kinds],
                rope_scaling={key: value for key, value in rope["full_attention"].items()
                              if key not in ("rope_theta", "partial_rotary_factor")},
                yarn_only_types=["full_attention"], num_attention_groups=text["num_key_value_heads"],
                attention_other_setting={"attention_type": "sliding_attention",
                                         "num_attention_heads": text["num_attention_heads"],
                                         "num_attention_groups": text["num_key_value_heads"],
                                         "head_dim": text["head_dim"]},
                moe_num_experts=text["n_routed_experts"], moe_top_k=text["num_experts_per_tok"],
                moe_layers_enum=",".join(str(index) for index, kind in enumerate(text["mlp_layer_types"])
                                         if kind == "sparse"),
                norm_expert_weight=True, moe_router_activation="sigmoid", use_moe_router_bias=True)
    return {**config, "text_config": text}


VISION_LANGUAGE_ROWS: list[Architecture] = [
    # Qwen2-VL-7B's text model: M-RoPE sections [16, 24, 24] over the whole 128-channel head, base 1000000
    Architecture(Model("qwen2-vl", "Qwen2VLConfig", "Qwen2VLForConditionalGeneration", pre_tokenizer="qwen2",
                       config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64, num_hidden_layers=1, max_position_embeddings=32768, bos_token_id=0,
                         eos_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                          "mrope_section": [16, 24, 24]}),
        vision_config=dict(depth=1, embed_dim=64, hidden_size=256, num_heads=2, mlp_ratio=1),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)),
        gguf="qwen2vl", tokenizer="byte-level", mistakes=(gguf_base("qwen2vl", 10000.0),)),
    # Qwen2.5-VL-7B's text model: M-RoPE sections [16, 24, 24] over the whole 128-channel head, base 1000000
    Architecture(Model("qwen2.5-vl", "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", pre_tokenizer="qwen2",
                       config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64, num_hidden_layers=1, max_position_embeddings=128000,
                         bos_token_id=0, eos_token_id=0,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [16, 24, 24]}),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=2, out_hidden_size=256,
                           fullatt_block_indexes=[0]),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)),
        gguf="qwen2vl", onnx=True, tokenizer="byte-level", mistakes=(gguf_base("qwen2vl", 10000.0),)),
    # Qwen3-VL-8B's text model: M-RoPE sections [24, 20, 20] interleaved over 128-channel heads, base 5000000
    Architecture(Model("qwen3-vl", "Qwen3VLConfig", "Qwen3VLForConditionalGeneration", pre_tokenizer="qwen2",
                       config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         intermediate_size=64, num_hidden_layers=1, max_position_embeddings=262144,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                          "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=2, out_hidden_size=256,
                           deepstack_visual_indexes=[]),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)),
        gguf="qwen3vl", onnx=True, tokenizer="byte-level", mistakes=(gguf_base("qwen3vl", 10000.0),)),
    # Qwen3-VL-30B-A3B's text model: M-RoPE sections [24, 20, 20] interleaved over 128-channel heads, base 5000000,
    # experts
    Architecture(Model("qwen3-vl-moe", "Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", pre_tokenizer="qwen2",
                       config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         intermediate_size=64, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                         num_hidden_layers=1, max_position_embeddings=262144,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                          "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=2, out_hidden_size=256,
                           deepstack_visual_indexes=[]),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)),
        gguf="qwen3vlmoe", tokenizer="byte-level", mistakes=(gguf_base("qwen3vlmoe", 10000.0),)),
    # GLM-4.1V-9B's text model: half of each 128-channel head rotates, M-RoPE sections [8, 12, 12] over that half,
    # base 10000, neighbouring channels paired
    Architecture(Model("glm4v", "Glm4vConfig", "Glm4vForConditionalGeneration", pre_tokenizer="glm4", config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=64, num_hidden_layers=1, max_position_embeddings=65536, pad_token_id=0,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                          "mrope_section": [8, 12, 12]}),
        vision_config=dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=64, out_hidden_size=256),
        image_token_id=500, video_token_id=501, image_start_token_id=502, image_end_token_id=503,
        video_start_token_id=504, video_end_token_id=505)),
        gguf="glm4", tokenizer="byte-level-chat",
        mistakes=(gguf_size("glm4", "rope.dimension_count", 128, "partial_rotary_dim_wrong"),)),
    # GLM-4.5V's text model: GLM-4.1V's attention (half of each 128-channel head, M-RoPE sections [8, 12, 12], base
    # 10000), experts after a dense first layer
    Architecture(Model("glm4v-moe", "Glm4vMoeConfig", "Glm4vMoeForConditionalGeneration", pre_tokenizer="glm4",
                       config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         intermediate_size=64, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2,
                         n_shared_experts=1, first_k_dense_replace=1, num_hidden_layers=2,
                         max_position_embeddings=65536, pad_token_id=0,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                          "mrope_section": [8, 12, 12]}),
        vision_config=dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=64, out_hidden_size=256),
        image_token_id=500, video_token_id=501, image_start_token_id=502, image_end_token_id=503,
        video_start_token_id=504, video_end_token_id=505)),
        # the model's base is 10000: a base of 500000 planted
        gguf="glm4moe", tokenizer="byte-level-chat", mistakes=(gguf_base("glm4moe", 500000.0),)),
    # PaddleOCR-VL-0.9B's text model (ERNIE-4.5-0.3B's): M-RoPE sections [16, 24, 24] over the whole 128-channel
    # head, base 500000
    Architecture(Model("paddleocr-vl", "PaddleOCRVLConfig", "PaddleOCRVLForConditionalGeneration", config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         intermediate_size=64, num_hidden_layers=1, max_position_embeddings=131072,
                         rope_parameters={"rope_type": "default", "rope_theta": 500000.0,
                                          "mrope_section": [16, 24, 24]}),
        vision_config=dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=64),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503)),
        gguf="paddleocr", mistakes=(gguf_base("paddleocr", 10000.0),)),
    # EXAONE-4.5-33B: EXAONE-4.0-32B's text model (sliding layers with llama3-scaled RoPE, factor 16 over base
    # 1000000, full layers without; 128-channel heads) beside a Qwen2.5-VL-style vision tower
    Architecture(Model("exaone4.5", "Exaone4_5_Config", "Exaone4_5_ForConditionalGeneration", pre_tokenizer="exaone4",
                       config=dict(
        text_config=dict(model_type="exaone4", vocab_size=512, hidden_size=256, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=128, intermediate_size=64, num_hidden_layers=2,
                         layer_types=["sliding_attention", "full_attention"], sliding_window=4096,
                         max_position_embeddings=131072, bos_token_id=0, eos_token_id=0,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192}),
        vision_config=dict(depth=1, hidden_size=64, intermediate_size=64, num_heads=2, num_key_value_heads=2,
                           out_hidden_size=256, fullatt_block_indexes=[0]),
        image_token_id=500, video_token_id=501)),
        gguf="exaone4", tokenizer="byte-level", mistakes=(gguf_base("exaone4", 10000.0),)),
    # MiniMax-M3: MiniMax-M2's attention (half of each 128-channel head rotates, base 5000000) beside sparse
    # lightning-indexer layers, experts after a dense first layer, a vision tower; written through the hub's
    # config.json (`_minimax_m3_hub_config`)
    Architecture(Model("minimax-m3-vl", "MiniMaxM3VLConfig", "MiniMaxM3SparseForConditionalGeneration",
                       pre_tokenizer="minimax-m2", config_json=True, config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         intermediate_size=64, dense_intermediate_size=64, shared_intermediate_size=64,
                         num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
                         mlp_layer_types=["dense", "sparse"], layer_types=["full_attention", "minimax_m3_sparse"],
                         index_n_heads=2, index_head_dim=32, index_block_size=4, index_topk_blocks=2,
                         index_local_blocks=1, rotary_dim=64, max_position_embeddings=524288, bos_token_id=0,
                         eos_token_id=0,
                         rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                          "partial_rotary_factor": 0.5}),
        vision_config=dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=64),
        projector_hidden_size=256, image_token_index=500, video_token_index=501)),
        gguf="minimax-m3", tokenizer="byte-level", hub_config=_minimax_m3_hub_config,
        mistakes=(gguf_size("minimax-m3", "rope.dimension_count", 128, "partial_rotary_dim_wrong"),)),
    # Chameleon-7B: RoPE over the whole 128-channel head, base 10000, 4096 positions, per-head q/k LayerNorm; image
    # Step-3.7-Flash's text model: full layers over base 5000000 rotating half of each 128-channel head with llama3
    # scaling (factor 2 from 131072 positions, on the full layers only), sliding layers (window 512) over base 10000
    # rotating the whole head; written through the hub's config.json (`_step3p7_hub_config`)
    Architecture(Model("step3p7", "Step3p7Config", "Step3p7ForConditionalGeneration", pre_tokenizer="llama-bpe",
                       config_json=True, config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         intermediate_size=64, moe_intermediate_size=64, share_expert_dim=64, n_routed_experts=4,
                         num_experts_per_tok=2, num_hidden_layers=2,
                         layer_types=["full_attention", "sliding_attention"], mlp_layer_types=["dense", "sparse"],
                         sliding_window=512, max_position_embeddings=262144,
                         pad_token_id=0, bos_token_id=0, eos_token_id=0,
                         rope_theta=[5000000.0, 10000.0], partial_rotary_factors=[0.5, 1.0],
                         rope_scaling={"rope_type": "llama3", "factor": 2.0,
                                       "original_max_position_embeddings": 131072, "low_freq_factor": 1.0,
                                       "high_freq_factor": 32.0}),
        vision_config=dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=64),
        image_token_id=500)),
        gguf="step35", tokenizer="byte-level", hub_config=_step3p7_hub_config,
        mistakes=(Mistake("freq_base_swa overwritten with 5000000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="step35.rope.freq_base_swa", value=5000000.0),)),
    # HunyuanOCR's text model: XD-RoPE's four sections [16, 16, 16, 16] over the whole 128-channel head, NTK-alpha 1000
    # over base 10000 (the converter writes the base and rope.scaling.alpha; llama.cpp's loader stretches the base)
    Architecture(Model("hunyuan-vl", "HunYuanVLConfig", "HunYuanVLForConditionalGeneration",
                       pre_tokenizer="hunyuan-dense", config=dict(
        text_config=dict(vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         intermediate_size=64, num_hidden_layers=1, max_position_embeddings=32768, bos_token_id=0,
                         eos_token_id=0, eod_token_id=0, pad_token_id=0, sep_token_id=0,
                         rope_parameters={"rope_type": "xdrope", "rope_theta": 10000.0, "alpha": 1000.0,
                                          "factor": 1.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                                          "mscale_all_dim": 1.0, "xdrope_section": [16, 16, 16, 16]}),
        vision_config=dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=64,
                           out_hidden_size=256, text_hidden_size=256),
        image_token_id=500, im_start_id=501, im_end_id=502, im_newline_id=503)),
        gguf="hunyuan_vl", tokenizer="byte-level",
        mistakes=(Mistake("rope.scaling.alpha overwritten with 1", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="hunyuan_vl.rope.scaling.alpha", value=1.0),)),
    # tokens from a VQ tokenizer in the same sequence
    Architecture(Model("chameleon", "ChameleonConfig", "ChameleonForConditionalGeneration", pre_tokenizer="chameleon",
                       config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
        num_hidden_layers=1, max_position_embeddings=4096, bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        vq_config=dict(embed_dim=64, num_embeddings=64, latent_channels=64, base_channels=32,
                       channel_multiplier=[1, 1], resolution=32, num_res_blocks=1),
        vocabulary_map={"<image>": 500})),
        gguf="chameleon", tokenizer="byte-level", mistakes=(gguf_base("chameleon", 500000.0),)),
]
