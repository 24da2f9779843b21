"""The architecture table's further rows (tests/converters/test_architectures.py runs them with the others): the
causal LMs of transformers that the issue names beyond its first list, and those onnxruntime-genai's builder lists,
that llama.cpp's converter or the builder writes: mixtures of experts, hybrids whose attention layers carry the RoPE,
YaRN with and without truncation, NTK-alpha scaling, partial rotary. Each row as the table's: the real model's
position settings, its attention sizes where the catalogue has its preset, one or two layers, a few experts."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.converters.checkpoints import SMALL, Model
from tests.converters.matrix import Architecture, Mistake, gguf_base, gguf_size


def _hub_layer_type(saved: str, hub: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A config.json edit: the layer type transformers 5 saves as `saved` spelled `hub`, as the hub's config.json
    spells it and the converter reads it (Granite-4's `attention` layers, saved as `full_attention`, which the
    converter does not count as attention: it then writes every layer as a Mamba-2 layer, without RoPE; Qwen4-Exp's
    `full_attention`, saved as `indexed_attention`, which the converter gives no compression ratio)."""
    def edit(config: dict[str, Any]) -> dict[str, Any]:
        return {**config, "layer_types": [hub if kind == saved else kind for kind in config["layer_types"]]}
    return edit


def _without_text_rope(key: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A config.json edit: `key` removed from the text model's rope_parameters (a composite's text_config)."""
    def edit(config: dict[str, Any]) -> dict[str, Any]:
        text = config["text_config"]
        rope = {name: value for name, value in text["rope_parameters"].items() if name != key}
        return {**config, "text_config": {**text, "rope_parameters": rope}}
    return edit


# Dots3-Note's published config.json (dots-studio/dots3-note-prev): the text model at the top level, its DSA layers
# named full_attention, the sliding layers' attention under swa_* keys and their base as swa_rope_theta, the keys the
# converter reads (Dots3NoteModel: swa_*, sliding_window_size, scoring_func); transformers 5 saves them as
# per_layer_config and rope_parameters per layer type, which the converter does not read
_DOTS3_HUB = dict(use_dsa=True, first_k_dense_replace=1, swa_num_attention_heads=2, swa_num_key_value_heads=2,
                  swa_q_lora_rank=32, swa_kv_lora_rank=32, swa_head_dim=256, swa_qk_nope_head_dim=192,
                  swa_qk_rope_head_dim=64, swa_v_head_dim=16, sliding_window_size=512, rope_theta=80000000.0,
                  swa_rope_theta=50000.0)


def _dots3_hub_config(config: dict[str, Any]) -> dict[str, Any]:
    hub = {key: value for key, value in config.items() if key not in ("rope_parameters", "per_layer_config")}
    kinds = ["full_attention" if kind == "indexed_attention" else kind for kind in config["layer_types"]]
    return {**hub, **_DOTS3_HUB, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "layer_types": kinds}


# DeepSeek-V4's published config.json: compress_ratios per layer, qk_rope_head_dim, the compressed layers' YaRN in
# rope_scaling (transformers 5 saves layer_types and rope_parameters {main, compress} instead)
_DSV4_HUB = dict(compress_ratios=[0, 4], qk_rope_head_dim=64, num_hash_layers=1, rope_theta=10000.0,
                 compress_rope_theta=160000.0, rope_scaling={"type": "yarn", "factor": 16.0, "beta_fast": 32,
                                                             "beta_slow": 1, "original_max_position_embeddings": 65536})
_DSV4_SAVED_ONLY = ("rope_parameters", "layer_types", "compress_rates", "mlp_layer_types", "partial_rotary_factor")


def _dsv4_hub_config(config: dict[str, Any]) -> dict[str, Any]:
    hub = {key: value for key, value in config.items() if key not in _DSV4_SAVED_ONLY}
    return {**hub, **_DSV4_HUB, "scoring_func": "sqrtsoftplus", "swiglu_limit": 10.0}


_DSV4_ROOT = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
              "model.hc_head.hc_fn": "hc_head_fn", "model.hc_head.hc_base": "hc_head_base",
              "model.hc_head.hc_scale": "hc_head_scale"}
_DSV4_EXPERT = re.compile(r"layers\.\d+\.ffn\.experts\.\d+\.w[123]\.weight$")


def _dsv4_hub_weights(tensors: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V4's tensors as the hub stores them: DeepSeek's own names (no `model.` prefix, `embed`, `hc_head_fn`,
    `attn.kv_norm`) and the routed experts in MXFP4 (two 4-bit codes a byte, one E8M0 exponent per 32 values: the
    only expert layout the converter reads). The expert codes are random; no position setting reads them."""
    import torch

    out: dict[str, Any] = {}
    for name, value in tensors.items():
        name = _DSV4_ROOT.get(name, re.sub(r"^model\.layers\.", "layers.", name))
        name = re.sub(r"^(layers\.\d+\.attn)\.norm\.weight$", r"\1.kv_norm.weight", name)
        if _DSV4_EXPERT.match(name):
            rows, cols = value.shape
            codes = torch.Generator().manual_seed(len(out))
            out[name] = torch.randint(0, 256, (rows, cols // 2), dtype=torch.uint8, generator=codes)
            out[name.removesuffix(".weight") + ".scale"] = torch.full((rows, cols // 32), 127, dtype=torch.uint8)
        else:
            out[name] = value
    return out


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
        gguf="granite", onnx=True, tokenizer="byte-level", hub_config=_hub_layer_type("full_attention", "attention"),
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
    # GLM-OCR's text model (zai-org/GLM-OCR: 128-channel heads, M-RoPE sections [16, 24, 24] over the whole head,
    # neighbouring channels paired), in its composite with a vision tower; the converter writes the text model as
    # llama.cpp's `glm4`, its q/k permuted for the M-RoPE kernel
    Architecture(Model("glm-ocr", "GlmOcrConfig", "GlmOcrForConditionalGeneration", pre_tokenizer="glm4", config=dict(
        text_config=dict(SMALL, num_attention_heads=2, num_key_value_heads=1, head_dim=128, num_hidden_layers=1,
                         max_position_embeddings=131072, pad_token_id=0,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
                                          "mrope_section": [16, 24, 24]}),
        vision_config=dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=64, out_hidden_size=256),
        image_token_id=500, video_token_id=501, image_start_token_id=502, image_end_token_id=503,
        video_start_token_id=504, video_end_token_id=505)),
        gguf="glm4", tokenizer="byte-level-chat",
        mistakes=(gguf_size("glm4", "rope.dimension_count", 64, "partial_rotary_dim_wrong"),
                  # transformers' default partial_rotary_factor is 1, the converter's own (Glm4Model) 0.5: a
                  # config.json that leaves it out converts to a GGUF that rotates half the channels the model does
                  Mistake("partial_rotary_factor left out of config.json (transformers' default 1, the converter's "
                          "0.5)", "convert_hf_to_gguf.py", frozenset({"partial_rotary_dim_wrong"}),
                          edit=_without_text_rope("partial_rotary_factor")))),
    # Qwen3-Omni-30B-A3B's thinker: 128-channel heads, M-RoPE sections [24, 20, 20] interleaved, base 1000000,
    # experts; a composite with vision and audio towers (no talker: enable_audio_output false); the converter writes
    # the thinker's text model as llama.cpp's `qwen3vlmoe`
    Architecture(Model("qwen3-omni-moe", "Qwen3OmniMoeConfig", "Qwen3OmniMoeForConditionalGeneration",
                       pre_tokenizer="qwen2", config=dict(enable_audio_output=False, thinker_config=dict(
        text_config=dict(SMALL, num_attention_heads=2, num_key_value_heads=1, head_dim=128,
                         moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, num_hidden_layers=1,
                         max_position_embeddings=65536,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                          "mrope_section": [24, 20, 20], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=64, out_hidden_size=256,
                           deepstack_visual_indexes=[]),
        audio_config=dict(encoder_layers=1, d_model=64, encoder_attention_heads=2, encoder_ffn_dim=64,
                          output_dim=256, downsample_hidden_size=32),
        audio_token_id=500, image_token_id=501, video_token_id=502, vision_start_token_id=503,
        audio_start_token_id=504))),
        gguf="qwen3vlmoe", tokenizer="byte-level", mistakes=(gguf_base("qwen3vlmoe", 10000.0),)),
    # Qwen4-Exp (Qwen3.8-Flash-Next): Qwen3.5's attention (a quarter of each 256-channel head rotated, M-RoPE
    # sections [11, 11, 10] interleaved) on its indexed layers, hyper-connections, the QSA indexer; the hub's
    # config.json names the indexed layers `full_attention`
    Architecture(Model("qwen4-exp", "Qwen4ExpTextConfig", "Qwen4ExpForCausalLM", pre_tokenizer="qwen35", config=dict(
        SMALL, head_dim=256, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        moe_intermediate_size=64, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        hc_count=2, hc_lowrank=16, indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=64, indexer_budget=16,
        indexer_compress_ratio=4, max_position_embeddings=262144, eos_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True})),
        gguf="qwen4exp", tokenizer="byte-level", hub_config=_hub_layer_type("indexed_attention", "full_attention"),
        mistakes=(gguf_base("qwen4exp", 10000.0),
                  gguf_size("qwen4exp", "rope.dimension_count", 256, "partial_rotary_dim_wrong"))),
    # Dots3-Note: MLA on every layer, DSA layers over base 80000000 and sliding-window layers over base 50000 with
    # heads of their own, a quarter of each 256-channel head rotated (qk_rope_head_dim 64); written through the
    # hub's config.json (`_dots3_hub_config`)
    Architecture(Model("dots3", "Dots3NoteTextConfig", "Dots3NoteForCausalLM", pre_tokenizer="qwen2", config_json=True,
                       config=dict(
        vocab_size=512, hidden_size=256, num_attention_heads=2, num_key_value_heads=2, intermediate_size=64,
        moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, num_hidden_layers=2,
        layer_types=["full_attention", "sliding_attention"], kv_lora_rank=32, q_lora_rank=32, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=16, head_dim=256, index_n_heads=2, index_head_dim=64, index_topk=16,
        max_position_embeddings=524288, pad_token_id=0, bos_token_id=0, eos_token_id=0, **_DOTS3_HUB)),
        gguf="dots3note", tokenizer="byte-level-chat", hub_config=_dots3_hub_config,
        mistakes=(gguf_base("dots3note", 10000.0),
                  Mistake("freq_base_swa overwritten with 80000000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="dots3note.rope.freq_base_swa", value=80000000.0))),
    # DeepSeek-V4: sliding-window layers over base 10000, compressed layers over base 160000 with YaRN (factor 16,
    # attention factor 1), an eighth of each 512-channel head rotated; the hub's config.json and tensors (the converter
    # reads no other)
    Architecture(Model("deepseek-v4", "DeepseekV4Config", "DeepseekV4ForCausalLM", pre_tokenizer="deepseek-v3",
                       config_json=True, config=dict(
        vocab_size=512, hidden_size=256, moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=512, q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=4,
        n_shared_experts=1, max_position_embeddings=1048576, hc_mult=2, hc_sinkhorn_iters=2, sliding_window=128,
        o_groups=1, o_lora_rank=32, index_n_heads=2, index_head_dim=64, index_topk=8, num_nextn_predict_layers=0,
        **_DSV4_HUB)),
        gguf="deepseek4", tokenizer="byte-level", hub_config=_dsv4_hub_config, hub_weights=_dsv4_hub_weights,
        mistakes=(gguf_base("deepseek4", 160000.0),
                  Mistake("compress_rope_freq_base overwritten with 10000", "convert_hf_to_gguf.py",
                          frozenset({"wrong_freq_base"}), key="deepseek4.attention.compress_rope_freq_base",
                          value=10000.0),
                  gguf_size("deepseek4", "rope.dimension_count", 128, "partial_rotary_dim_wrong"))),
    # Mistral-Small-4 (Mistral3ForConditionalGeneration with a `mistral4` text model): latent attention, half of each
    # 128-channel head rotated (qk_rope_head_dim 64), yarn factor 128 with mscale = mscale_all_dim = 1 (the converter's
    # yarn_log_multiplier 0.1, which llama.cpp's DeepSeek-V2 loader reads), beside a Pixtral vision tower;
    Architecture(Model("mistral-small-4", "Mistral3Config", "Mistral3ForConditionalGeneration", pre_tokenizer="tekken",
                       config=dict(
        text_config=dict(model_type="mistral4", vocab_size=512, hidden_size=256, intermediate_size=64,
                         moe_intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         n_routed_experts=4, num_experts_per_tok=2, kv_lora_rank=32, q_lora_rank=32,
                         qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=16, head_dim=128,
                         max_position_embeddings=1048576, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                                          "original_max_position_embeddings": 8192, "beta_fast": 32.0,
                                          "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                                          "llama_4_scaling_beta": 0.1, "partial_rotary_factor": 0.5}),
        vision_config=dict(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           head_dim=32, image_size=64, patch_size=16),
        image_token_index=500)),
        # the builder claims the class (for Mistral-Small-3's llama-like text model) and stops at its latent attention
        gguf="mistral4", tokenizer="byte-level", onnx_refusal="'Mistral4Attention' object has no attribute 'k_proj'",
        mistakes=(gguf_size("mistral4", "rope.dimension_count", 32, "partial_rotary_dim_wrong"),
                  Mistake("yarn_log_multiplier overwritten with 0.0707", "convert_hf_to_gguf.py",
                          frozenset({"attention_factor_wrong"}), key="mistral4.rope.scaling.yarn_log_multiplier",
                          value=0.0707))),
]
