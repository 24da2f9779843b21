"""Every further architecture of llama.cpp's converter and onnxruntime-genai's builder that issue 61 names (and the
builder's Mistral, Gemma and OLMo), one row of one table each (`ARCHITECTURES`): its tiny checkpoint (the real
model's position settings; its attention sizes where the catalogue has a preset of it), which tools build it, and a
mistake planted in what they write. Each row goes through `matrix.check_correct` (its config.json, GGUF and ONNX
model audited correct against the config.json and the preset; a builder's refusal held) and `matrix.check_mistake`
(each planted mistake named), and its claims are checked against the tools' registries. An architecture left out
is listed apart (`UNSUPPORTED`) with the reason, and a test checks that the reason still holds. Under pytest-xdist
each row is a group of its own (conftest.py): its checkpoint is written, converted and built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.converters.checkpoints import SMALL, Model
from tests.converters.matrix import (
    Architecture,
    Built,
    Mistake,
    Unsupported,
    assert_tools_claim,
    assert_unsupported,
    check_correct,
    check_mistake,
    gguf_base,
    gguf_size,
    with_rope,
    without_keys,
)
from tests.converters.more_architectures import MORE_ARCHITECTURES
from tests.converters.registered_hybrid_and_other import HYBRID_AND_OTHER_ROWS
from tests.converters.registered_latent_attention import LATENT_ATTENTION_ROWS
from tests.converters.registered_vision_language import VISION_LANGUAGE_ROWS
from tests.converters.tools import need_builder, need_llama_cpp

ARCHITECTURES: list[Architecture] = [
    # Qwen3-8B (the catalogue's qwen3-8b): q/k norms, head_dim 128 stated apart from hidden // heads
    Architecture(Model("qwen3", "Qwen3Config", "Qwen3ForCausalLM", preset="qwen3-8b", config=dict(
        vocab_size=512, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=64, num_hidden_layers=1, max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        gguf="qwen3", onnx=True,
        # the converter writes no rope.dimension_count: llama.cpp rotates the whole (smaller) head
        mistakes=(gguf_size("qwen3", "attention.key_length", 64, "head_dim_wrong", "partial_rotary_dim_wrong"),)),
    # Mixtral-8x7B: written as llama.cpp's `llama` architecture, its experts merged per layer
    Architecture(Model("mixtral", "MixtralConfig", "MixtralForCausalLM", preset="mixtral-8x7b", config=dict(
        vocab_size=512, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=64,
        num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=1, max_position_embeddings=32768,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
        gguf="llama", mistakes=(gguf_base("llama", 10000.0),)),
    # OLMo-2-1124-7B's base 500000
    Architecture(Model("olmo-2", "Olmo2Config", "Olmo2ForCausalLM", pre_tokenizer="dbrx", config=dict(
        SMALL, num_key_value_heads=4, num_hidden_layers=1, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        gguf="olmo2", tokenizer="byte-level", mistakes=(gguf_base("olmo2", 10000.0),)),
    # StableLM-2-1.6B: a quarter of each head rotates
    Architecture(Model("stablelm-2", "StableLmConfig", "StableLmForCausalLM", pre_tokenizer="stablelm2", config=dict(
        SMALL, num_key_value_heads=4, num_hidden_layers=1, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})),
        gguf="stablelm", tokenizer="byte-level",
        mistakes=(gguf_size("stablelm", "rope.dimension_count", 64, "partial_rotary_dim_wrong"),)),
    # Falcon-7B (the catalogue's falcon-7b): 71 heads of 64, one KV head (multi_query), parallel attention.
    # transformers 5 saves num_kv_heads 71 (its default) beside num_key_value_heads 1, and the converter, which
    # reads num_kv_heads, stops on it (shape '[71, 3, 64, 4544]' is invalid): it is handed the hub's config.json,
    # without num_kv_heads (its default: 1), read as it is (FalconConfig would put 71 back); the audits judge by
    # the saved one
    Architecture(Model("falcon", "FalconConfig", "FalconForCausalLM", preset="falcon-7b", pre_tokenizer="falcon",
                       config_json=True,
                       config=dict(vocab_size=512, hidden_size=4544, num_attention_heads=71, multi_query=True,
                                   new_decoder_architecture=False, parallel_attn=True, bias=False,
                                   ffn_hidden_size=64, num_hidden_layers=1, max_position_embeddings=2048,
                                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="falcon", tokenizer="byte-level", hub_config=without_keys("num_kv_heads"),
        # the converter writes no freq_base (llama.cpp's default 10000 is Falcon's) and a context of 2048 whatever
        # the config says: that context planted past the model's instead
        mistakes=(gguf_size("falcon", "context_length", 4096, "context_beyond_model"),)),
    # Granite-3.1-2B's base 5000000 and 128K context
    Architecture(Model("granite", "GraniteConfig", "GraniteForCausalLM", config=dict(
        SMALL, num_hidden_layers=1, max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0})),
        gguf="granite", onnx=True, mistakes=(gguf_base("granite", 10000.0),)),
    # Command-R (c4ai-command-r-v01): base 8000000, neighbouring channels paired
    Architecture(Model("command-r", "CohereConfig", "CohereForCausalLM", pre_tokenizer="command-r", config=dict(
        SMALL, num_key_value_heads=4, num_hidden_layers=1, max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 8000000.0})),
        gguf="command-r", tokenizer="byte-level", mistakes=(gguf_base("command-r", 10000.0),)),
    # StarCoder2-3B: base 999999.44, a 4096-token sliding window on every layer
    Architecture(Model("starcoder2", "Starcoder2Config", "Starcoder2ForCausalLM", pre_tokenizer="starcoder",
                       config=dict(SMALL, num_hidden_layers=1, max_position_embeddings=16384, sliding_window=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 999999.4420358813})),
        gguf="starcoder2", tokenizer="byte-level", mistakes=(gguf_base("starcoder2", 10000.0),)),
    # Phi-4-mini: Phi-3's architecture with three quarters of each head rotated, longrope over those channels
    # (its config.json spells the scaling as the hub's does, `type` beside the factors: the builder reads `type`)
    Architecture(Model("phi-4-mini", "Phi3Config", "Phi3ForCausalLM", pre_tokenizer="gpt-4o", config=dict(
        SMALL, num_hidden_layers=1, max_position_embeddings=131072, original_max_position_embeddings=4096,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, rope_theta=10000.0, partial_rotary_factor=0.75,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + i / 48 for i in range(24)],
                      "long_factor": [1.0 + i / 6 for i in range(24)]})),
        gguf="phi3", onnx=True, tokenizer="byte-level",
        mistakes=(gguf_size("phi3", "rope.dimension_count", 64, "partial_rotary_dim_wrong"),
                  # the builder's caches of another base: `theta` (the caches' own diagnosis) in both branches
                  Mistake("rope_theta 250000 (Phi-4's) in config.json", "onnxruntime-genai builder",
                          frozenset({"theta"}), edit=with_rope(rope_theta=250000.0),
                          config_named=frozenset({"wrong_freq_base"})))),
    # EXAONE-4.0-32B: three sliding-window layers with RoPE to one full layer without; llama3 scaling
    Architecture(Model("exaone-4", "Exaone4Config", "Exaone4ForCausalLM", pre_tokenizer="exaone4", config=dict(
        SMALL, head_dim=64, num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
        sliding_window=4096, max_position_embeddings=131072,
        rope_parameters={"rope_type": "llama3", "rope_theta": 1000000.0, "factor": 16.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
        gguf="exaone4", tokenizer="byte-level", mistakes=(gguf_base("exaone4", 10000.0),)),
    # SmolLM3-3B: base 5000000, every fourth layer without RoPE. onnxruntime-genai 0.18.0 claims it but stops at
    # its first layer without RoPE (it applies RoPE apart there, from a position_ids input its CPU model lacks)
    Architecture(Model("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", config=dict(
        SMALL, num_hidden_layers=4, max_position_embeddings=65536, no_rope_layer_interval=4, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 5000000.0})),
        gguf="smollm3", onnx_refusal="KeyError: 'position_ids'", mistakes=(gguf_base("smollm3", 10000.0),)),
    # ERNIE-4.5-0.3B: base 500000, neighbouring channels paired
    Architecture(Model("ernie-4.5", "Ernie4_5Config", "Ernie4_5ForCausalLM", config=dict(
        SMALL, head_dim=64, num_hidden_layers=1, max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
        gguf="ernie4_5", onnx=True, mistakes=(gguf_base("ernie4_5", 10000.0),)),
    # GLM-4-9B-0414: half of each head rotates, neighbouring channels paired
    Architecture(Model("glm-4", "Glm4Config", "Glm4ForCausalLM", pre_tokenizer="glm4", config=dict(
        SMALL, head_dim=64, num_hidden_layers=1, max_position_embeddings=32768, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
        gguf="glm4", tokenizer="byte-level-chat",
        mistakes=(gguf_size("glm4", "rope.dimension_count", 64, "partial_rotary_dim_wrong"),)),
    # Llama-4-Scout's text model: llama3 scaling (factor 8), every fourth layer without RoPE, q/k norms
    Architecture(Model("llama-4", "Llama4TextConfig", "Llama4ForCausalLM", pre_tokenizer="llama4", config=dict(
        SMALL, head_dim=64, intermediate_size_mlp=64, num_local_experts=2, num_hidden_layers=4,
        max_position_embeddings=10485760, attention_chunk_size=8192, no_rope_layer_interval=4,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
        gguf="llama4", tokenizer="byte-level", mistakes=(gguf_base("llama4", 10000.0),)),
    # Gemma-2-9B (the catalogue's gemma-2-9b): sliding and full layers alternate, one RoPE for both
    Architecture(Model("gemma-2", "Gemma2Config", "Gemma2ForCausalLM", preset="gemma-2-9b", config=dict(
        vocab_size=512, hidden_size=3584, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
        query_pre_attn_scalar=256, intermediate_size=64, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=4096, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="gemma2", onnx=True,
        # the converter writes no freq_base (llama.cpp's default 10000 is Gemma-2's): a size planted instead
        mistakes=(gguf_size("gemma2", "attention.key_length", 128, "head_dim_wrong", "partial_rotary_dim_wrong"),)),
]

# transformers' causal LMs with RoPE that neither tool supports (the families posenc's table of architectures
# spells apart among them), and one that both tools' side supports but transformers cannot write
NEITHER = "neither llama.cpp's converter nor onnxruntime-genai's builder registers"
# the further architectures onnxruntime-genai's builder builds (and the converter converts)
ARCHITECTURES += [
    # Mistral-7B-v0.1 (the catalogue's mistral-7b): written as llama.cpp's `llama`, a 4096-token sliding window
    Architecture(Model("mistral", "MistralConfig", "MistralForCausalLM", preset="mistral-7b", config=dict(
        vocab_size=512, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=64,
        num_hidden_layers=1, max_position_embeddings=32768, sliding_window=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="llama", onnx=True, mistakes=(gguf_base("llama", 1000000.0),)),
    # Gemma-2B (the catalogue's gemma-2b): heads of 256 over a 2048-wide model, one KV head
    Architecture(Model("gemma", "GemmaConfig", "GemmaForCausalLM", preset="gemma-2b", config=dict(
        vocab_size=512, hidden_size=2048, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
        intermediate_size=64, num_hidden_layers=1, max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="gemma", onnx=True,
        # the converter writes no freq_base (llama.cpp's default 10000 is Gemma's): a size planted instead
        mistakes=(gguf_size("gemma", "attention.key_length", 128, "head_dim_wrong", "partial_rotary_dim_wrong"),)),
    # OLMo-1B
    Architecture(Model("olmo", "OlmoConfig", "OlmoForCausalLM", pre_tokenizer="olmo", config=dict(
        SMALL, num_key_value_heads=4, num_hidden_layers=1, max_position_embeddings=2048, pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
        gguf="olmo", onnx=True, tokenizer="byte-level", mistakes=(gguf_base("olmo", 500000.0),)),
    *MORE_ARCHITECTURES,
    *VISION_LANGUAGE_ROWS,
    *LATENT_ATTENTION_ROWS,
    *HYBRID_AND_OTHER_ROWS,
]
REMOTE_CODE = "transformers 5.25 has no model class for it (the hub's checkpoints are remote code): no checkpoint " \
    "save_pretrained writes"

UNSUPPORTED: list[Unsupported] = [
    Unsupported("gpt-j", "GPTJForCausalLM", f"{NEITHER} it (GPT-J's interleaved partial rotary, rotary_dim 64)"),
    Unsupported("codegen", "CodeGenForCausalLM", f"{NEITHER} it (GPT-J's rotary, rotary_dim)"),
    Unsupported("jetmoe", "JetMoeForCausalLM", f"{NEITHER} it (its head size is kv_channels)"),
    Unsupported("zamba2", "Zamba2ForCausalLM", f"{NEITHER} it (its head size is attention_head_dim)"),
    Unsupported("persimmon", "PersimmonForCausalLM", f"{NEITHER} it (partial rotary 0.5)"),
    Unsupported("helium", "HeliumForCausalLM", f"{NEITHER} it"),
    Unsupported("diffllama", "DiffLlamaForCausalLM", f"{NEITHER} it"),
    Unsupported("internlm3", "InternLM3ForCausalLM", "the converter registers it (InternLM3Model) but transformers "
                "5.25 has only InternLM3Config, no model class (the hub's checkpoints are remote code): no checkpoint "
                "save_pretrained writes", converter=True, no_model_class=True),
    Unsupported("chatglm", "ChatGLMModel", f"both tools register it, but {REMOTE_CODE}", converter=True, builder=True,
                no_model_class=True),
    Unsupported("internlm2", "InternLM2ForCausalLM", f"both tools register it, but {REMOTE_CODE}", converter=True,
                builder=True, no_model_class=True),
    Unsupported("phimoe", "PhimoeForCausalLM", "transformers writes PhimoeForCausalLM, which neither tool registers "
                "(both register the hub's remote-code spelling, PhiMoEForCausalLM)"),
    Unsupported("phi-3-small", "Phi3SmallForCausalLM", f"the builder builds it, but {REMOTE_CODE}", builder=True,
                no_model_class=True),
    # the converter registers these, but converts no checkpoint transformers writes (its audit is tested with a
    # hand-built file of what it writes where the audit had a finding: tests/audit/test_converter_findings_*.py)
    Unsupported("deepseek-v3.2", "DeepseekV32ForCausalLM", "the converter's set_vocab asserts add_bos_token, which "
                "transformers 5.25's fast tokenizers drop on load", converter=True),
    Unsupported("hunyuan-a13b", "HunYuanMoEV1ForCausalLM", "the converter's set_vocab reads the hub tokenizer's "
                "tiktoken mergeable_ranks (remote code)", converter=True),
    Unsupported("solar-open", "SolarOpenForCausalLM", "the converter's set_vocab looks up the hub tokenizer's own "
                "special tokens (<unk>, <|startoftext|>) by name", converter=True),
    Unsupported("nomic-bert", "NomicBertModel", "the converter reads nomic-ai's remote-code config.json (n_embd, "
                "rotary_emb_base, asserts on prenorm) and a WordPiece or Unigram vocabulary", converter=True),
    Unsupported("pocket-tts", "PocketTTSModel", "the converter reads kyutai's original folder (sizes from tensor "
                "shapes, a unigram tokenizer.model), not a transformers checkpoint", converter=True),
    Unsupported("muse-glimmer-assistant", "MuseGlimmerAssistantModel", "a draft model: the converter needs its target "
                "model's folder (--target-model-dir)", converter=True),
    Unsupported("granite-4-vision", "Granite4VisionForConditionalGeneration", "the converter registers the class for "
                "the vision projector (mmproj) alone; the text model converts as GraniteForCausalLM", converter=True),
    Unsupported("glm-5-next", "Glm5NextForConditionalGeneration", "its text model has no RoPE (linear attention and "
                "MLA layers without a rotated part): nothing of position handling to audit", converter=True),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Built:
    return Built(tmp_path_factory, request)


@pytest.mark.parametrize("row", ARCHITECTURES, ids=lambda row: row.model.name)
def test_the_artifacts_are_correct(row: Architecture, built: Built) -> None:
    check_correct(row, built)


@pytest.mark.parametrize(("row", "mistake"), [(row, mistake) for row in ARCHITECTURES for mistake in row.mistakes],
                         ids=lambda value: value.id if isinstance(value, Mistake) else value.model.name)
def test_a_mistake_is_named(row: Architecture, mistake: Mistake, built: Built, tmp_path: Path) -> None:
    check_mistake(row.model, built.checkpoint(row), built.gguf(row) if row.gguf else None, tmp_path, mistake)


@pytest.mark.parametrize("row", ARCHITECTURES, ids=lambda row: row.model.name)
def test_the_table_says_what_each_tool_supports(row: Architecture) -> None:
    need_llama_cpp()
    need_builder()
    assert_tools_claim(row)


@pytest.mark.parametrize("entry", UNSUPPORTED, ids=lambda entry: entry.name)
def test_the_reason_an_architecture_is_left_out_still_holds(entry: Unsupported) -> None:
    need_llama_cpp()
    need_builder()
    assert_unsupported(entry)
