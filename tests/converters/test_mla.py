"""Multi-head latent attention through the real converter (issue 61): a DeepSeek-V2-Lite-style checkpoint (yarn
factor 40 with mscale = mscale_all_dim = 0.707, written by llama.cpp's converter in its compressed layout:
key_length = kv_lora_rank + qk_rope_head_dim, key_length_mla = the q/k head, one KV head, yarn_log_multiplier =
0.1 x mscale_all_dim) and a MiniCPM3 one (longrope over the 32 rotated channels of its 96-channel q/k heads,
key_length = nope + rope). Before the audit knew these layouts, every such GGUF was WRONG: head_count_wrong,
head_dim_wrong, and DeepSeek's tables 0.1 ln 40 off from position 0. onnxruntime-genai's builder has neither model,
so they are converted to GGUF alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.converters.checkpoints import Model, save_checkpoint
from tests.converters.matrix import Mistake, assert_correct, check_mistake
from tests.converters.tools import convert_to_gguf

# DeepSeek-V2-Lite's attention and position settings (the catalogue's preset), one dense layer (no experts): a
# byte-level BPE vocabulary, the converter told DeepSeek's pre-tokenizer
DEEPSEEK_V2_LITE = Model(
    "deepseek-v2-lite", "DeepseekV2Config", "DeepseekV2ForCausalLM", preset="deepseek-v2-lite",
    pre_tokenizer="deepseek-llm", config=dict(
        vocab_size=512, hidden_size=2048, num_attention_heads=16, num_key_value_heads=16, qk_nope_head_dim=128,
        qk_rope_head_dim=64, kv_lora_rank=512, v_head_dim=128, q_lora_rank=None, intermediate_size=64,
        moe_intermediate_size=64, num_hidden_layers=1, first_k_dense_replace=1, max_position_embeddings=163840,
        bos_token_id=0, eos_token_id=0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 0.707, "mscale_all_dim": 0.707}))
# MiniCPM3-4B's attention and longrope settings (16 short and 16 long factors, original = max = 32768)
MINICPM3 = Model("minicpm3", "MiniCPM3Config", "MiniCPM3ForCausalLM", config=dict(
    vocab_size=512, hidden_size=2560, num_attention_heads=40, num_key_value_heads=40, qk_nope_head_dim=64,
    qk_rope_head_dim=32, kv_lora_rank=256, q_lora_rank=768, v_head_dim=64, intermediate_size=64, num_hidden_layers=1,
    max_position_embeddings=32768, bos_token_id=1, eos_token_id=2,
    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 32768,
                     "short_factor": [1.0 + i / 16 for i in range(16)],
                     "long_factor": [1.0 + i / 8 for i in range(16)]}))

MISTAKES = [
    (DEEPSEEK_V2_LITE, Mistake("rope.scaling.yarn_log_multiplier overwritten with 0.1 (mscale_all_dim 1)",
                               "convert_hf_to_gguf.py", frozenset({"attention_factor_wrong"}),
                               key="deepseek2.rope.scaling.yarn_log_multiplier", value=0.1)),
    (DEEPSEEK_V2_LITE, Mistake("attention.key_length_mla overwritten with the rotated part 64", "convert_hf_to_gguf.py",
                               frozenset({"head_dim_wrong"}), key="deepseek2.attention.key_length_mla", value=64)),
    (MINICPM3, Mistake("attention.key_length overwritten with the rotated part 32", "convert_hf_to_gguf.py",
                       frozenset({"head_dim_wrong"}), key="minicpm3.attention.key_length", value=32)),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, byte_level_files: Path,
                sentencepiece_files: Path) -> dict[str, Path]:
    return {DEEPSEEK_V2_LITE.name: save_checkpoint(DEEPSEEK_V2_LITE, tmp_path_factory.mktemp(DEEPSEEK_V2_LITE.name),
                                                   byte_level_files),
            MINICPM3.name: save_checkpoint(MINICPM3, tmp_path_factory.mktemp(MINICPM3.name), sentencepiece_files)}


@pytest.fixture(scope="module")
def ggufs(checkpoints: dict[str, Path]) -> dict[str, Path]:
    return {model.name: convert_to_gguf(checkpoints[model.name], checkpoints[model.name].parent / f"{model.name}.gguf",
                                        model.pre_tokenizer) for model in (DEEPSEEK_V2_LITE, MINICPM3)}


@pytest.mark.parametrize("model", [DEEPSEEK_V2_LITE, MINICPM3], ids=lambda m: m.name)
def test_the_checkpoint_and_gguf_are_correct(model: Model, checkpoints: dict[str, Path],
                                             ggufs: dict[str, Path]) -> None:
    checkpoint = checkpoints[model.name]
    for artifact in (checkpoint / "config.json", checkpoint / "model.safetensors", ggufs[model.name]):
        assert_correct(model, checkpoint, artifact)


@pytest.mark.parametrize(("model", "mistake"), MISTAKES, ids=lambda m: m.id if isinstance(m, Mistake) else m.name)
def test_a_mistake_is_named(model: Model, mistake: Mistake, checkpoints: dict[str, Path], ggufs: dict[str, Path],
                            tmp_path: Path) -> None:
    check_mistake(model, checkpoints[model.name], ggufs[model.name], tmp_path, mistake)
