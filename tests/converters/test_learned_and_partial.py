"""GPT-2 (learned absolute positions, no RoPE: the `wpe` table, llama.cpp's `position_embd`), and partial rotary
through the real converters: Phi-2 (partial_rotary_factor 0.4: 32 of 80 channels rotate) and Pythia-160M (GPT-NeoX,
rotary_pct 0.25: 16 of 64). onnxruntime-genai 0.18.0's builder builds Phi-2; it has no GPT-2 or GPT-NeoX builder
(`NotImplementedError: The ... model is not currently supported.`), so those two are converted to GGUF alone."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.converters.checkpoints import Model, save_checkpoint
from tests.converters.matrix import Mistake, assert_correct, check_mistake, without
from tests.converters.tools import build_onnx, convert_to_gguf, converter_command, record_refusal

# byte-level BPE vocabularies: the converter is told the pre-tokenizer of the real model (tools.DECLARED_PRE_TOKENIZER)
# GPT-2's config.json on the hub carries `n_ctx` (transformers 4's spelling of n_positions), which the converter reads
# and transformers 5 no longer writes (without it: KeyError: 'n_ctx')
GPT_2 = Model("gpt-2", "GPT2Config", "GPT2LMHeadModel", pre_tokenizer="gpt-2", hub_keys={"n_ctx": 1024}, config=dict(
    vocab_size=512, n_embd=768, n_head=12, n_layer=1, n_inner=64, n_positions=1024, bos_token_id=0,
    eos_token_id=0))
PHI_2 = Model("phi-2", "PhiConfig", "PhiForCausalLM", pre_tokenizer="phi-2", config=dict(
    vocab_size=512, hidden_size=320, num_attention_heads=4, num_key_value_heads=4, intermediate_size=64,
    num_hidden_layers=1, max_position_embeddings=2048, bos_token_id=0, eos_token_id=0,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4}))
# Pythia's config.json on the hub spells its partial rotary `rotary_pct` and its base `rotary_emb_base`
# (transformers 4); transformers 5 writes them into rope_parameters only, and the converter reads `rotary_pct`
# (without it: KeyError: 'rotary_pct')
PYTHIA_KEYS = {"rotary_pct": 0.25, "rotary_emb_base": 10000}
PYTHIA = Model("pythia-160m", "GPTNeoXConfig", "GPTNeoXForCausalLM", preset="pythia-160m", pre_tokenizer="gpt-2",
               hub_keys=PYTHIA_KEYS, config_json=True, config=dict(
                   vocab_size=512, hidden_size=768, num_attention_heads=12, intermediate_size=64, num_hidden_layers=1,
                   max_position_embeddings=2048, bos_token_id=0, eos_token_id=0, **PYTHIA_KEYS))

MISTAKES = [
    (GPT_2, Mistake("context_length overwritten with 2048, past the learned table", "convert_hf_to_gguf.py",
                    frozenset({"context_beyond_model"}), key="gpt2.context_length", value=2048)),
    (PHI_2, Mistake("partial_rotary_factor dropped from config.json", "onnxruntime-genai builder",
                    frozenset({"partial_rotary_dim_wrong"}), edit=without("partial_rotary_factor"),
                    config_named=frozenset({"partial_rotary_dim_wrong"}))),
    (PYTHIA, Mistake("rope.dimension_count overwritten with the head size 64", "convert_hf_to_gguf.py",
                     frozenset({"partial_rotary_dim_wrong"}), key="gptneox.rope.dimension_count", value=64)),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, byte_level_files: Path) -> dict[str, Path]:
    return {model.name: save_checkpoint(model, tmp_path_factory.mktemp(model.name), byte_level_files)
            for model in (GPT_2, PHI_2, PYTHIA)}


@pytest.fixture(scope="module")
def ggufs(checkpoints: dict[str, Path]) -> dict[str, Path]:
    return {model.name: convert_to_gguf(folder, folder.parent / f"{model.name}.gguf", model.pre_tokenizer,
                                        model.config_json)
            for model in (GPT_2, PHI_2, PYTHIA) for folder in (checkpoints[model.name],)}


@pytest.mark.parametrize("model", [GPT_2, PHI_2, PYTHIA], ids=lambda m: m.name)
def test_the_checkpoint_and_gguf_are_correct(model: Model, checkpoints: dict[str, Path],
                                             ggufs: dict[str, Path]) -> None:
    checkpoint = checkpoints[model.name]
    for artifact in (checkpoint / "config.json", checkpoint / "model.safetensors", ggufs[model.name]):
        assert_correct(model, checkpoint, artifact)


def test_the_phi2_onnx_model_is_correct(checkpoints: dict[str, Path]) -> None:
    checkpoint = checkpoints[PHI_2.name]
    result = build_onnx(checkpoint, checkpoint.parent / "onnx")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_correct(PHI_2, checkpoint, checkpoint.parent / "onnx" / "model.onnx")


def test_the_converter_misses_pythias_hub_keys_under_transformers_5(checkpoints: dict[str, Path]) -> None:
    """Read through transformers 5's AutoConfig, the hub's `rotary_pct` the converter needs is gone: it stops with a
    KeyError (the checkpoint above is converted with its config.json read as it is)."""
    checkpoint = checkpoints[PYTHIA.name]
    result = subprocess.run(converter_command(checkpoint, checkpoint.parent / "autoconfig.gguf", PYTHIA.pre_tokenizer),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "KeyError: 'rotary_pct'" in result.stderr, result.stderr[-3000:]
    record_refusal(PYTHIA, "convert_hf_to_gguf.py", "through transformers 5.23's AutoConfig: "
                   + result.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize(("model", "mistake"), MISTAKES, ids=lambda m: m.id if isinstance(m, Mistake) else m.name)
def test_a_mistake_is_named(model: Model, mistake: Mistake, checkpoints: dict[str, Path], ggufs: dict[str, Path],
                            tmp_path: Path) -> None:
    check_mistake(model, checkpoints[model.name], ggufs[model.name], tmp_path, mistake)
