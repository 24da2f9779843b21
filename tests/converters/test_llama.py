"""Llama-3.1 (llama3 scaling: llama.cpp writes its frequency factors as the `rope_freqs` tensor, onnxruntime-genai
bakes them into its caches) and Llama-2 (unscaled RoPE, base 10000) through the real converters."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.converters.checkpoints import Model, save_checkpoint
from tests.converters.matrix import Mistake, assert_correct, check_mistake, without
from tests.converters.tools import build_onnx, convert_to_gguf

LLAMA_31 = Model("llama-3.1", "LlamaConfig", "LlamaForCausalLM", preset="llama-3.1-8b", config=dict(
    vocab_size=512, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    intermediate_size=64, num_hidden_layers=1, max_position_embeddings=131072,
    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}))
LLAMA_2 = Model("llama-2", "LlamaConfig", "LlamaForCausalLM", preset="llama-2-7b", config=dict(
    vocab_size=512, hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, intermediate_size=64,
    num_hidden_layers=1, max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))

LLAMA3_KEYS = ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
LLAMA_31_MISTAKES = [
    Mistake("llama3 scaling dropped from config.json", "convert_hf_to_gguf.py",
            frozenset({"frequency_factors_missing"}), edit=without(*LLAMA3_KEYS),
            config_named=frozenset({"scaling_missing"})),
    # the converter writes no freq_base (llama.cpp's default 10000) and computes rope_freqs for base 10000 too
    Mistake("rope_theta dropped from config.json", "convert_hf_to_gguf.py",
            frozenset({"wrong_freq_base", "frequency_factors_wrong"}), edit=without("rope_theta"),
            config_named=frozenset({"wrong_freq_base"})),
    Mistake("freq_base overwritten with 10000", "convert_hf_to_gguf.py", frozenset({"wrong_freq_base"}),
            key="llama.rope.freq_base", value=10000.0),
    Mistake("llama3 scaling dropped from config.json", "onnxruntime-genai builder",
            frozenset({"scaling_not_applied"}), edit=without(*LLAMA3_KEYS)),
]


@pytest.fixture(scope="module")
def llama31(tmp_path_factory: pytest.TempPathFactory, sentencepiece_files: Path) -> Path:
    return save_checkpoint(LLAMA_31, tmp_path_factory.mktemp("llama-3.1"), sentencepiece_files)


@pytest.fixture(scope="module")
def llama31_gguf(llama31: Path) -> Path:
    return convert_to_gguf(llama31, llama31.parent / "llama-3.1.gguf")


@pytest.fixture(scope="module")
def llama2(tmp_path_factory: pytest.TempPathFactory, sentencepiece_files: Path) -> Path:
    return save_checkpoint(LLAMA_2, tmp_path_factory.mktemp("llama-2"), sentencepiece_files)


@pytest.mark.parametrize(("model", "fixture"), [(LLAMA_31, "llama31"), (LLAMA_2, "llama2")], ids=["3.1", "2"])
def test_the_checkpoint_is_correct(model: Model, fixture: str, request: pytest.FixtureRequest) -> None:
    checkpoint: Path = request.getfixturevalue(fixture)
    for artifact in (checkpoint / "config.json", checkpoint / "model.safetensors"):
        assert_correct(model, checkpoint, artifact)


def test_the_llama31_gguf_is_correct(llama31: Path, llama31_gguf: Path) -> None:
    assert_correct(LLAMA_31, llama31, llama31_gguf)


def test_the_llama2_gguf_is_correct(llama2: Path) -> None:
    assert_correct(LLAMA_2, llama2, convert_to_gguf(llama2, llama2.parent / "llama-2.gguf"))


@pytest.mark.parametrize(("model", "fixture"), [(LLAMA_31, "llama31"), (LLAMA_2, "llama2")], ids=["3.1", "2"])
def test_the_onnx_model_is_correct(model: Model, fixture: str, request: pytest.FixtureRequest) -> None:
    checkpoint: Path = request.getfixturevalue(fixture)
    result = build_onnx(checkpoint, checkpoint.parent / "onnx")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_correct(model, checkpoint, checkpoint.parent / "onnx" / "model.onnx")


@pytest.mark.parametrize("mistake", LLAMA_31_MISTAKES, ids=lambda m: m.id)
def test_a_llama31_mistake_is_named(mistake: Mistake, llama31: Path, llama31_gguf: Path, tmp_path: Path) -> None:
    check_mistake(LLAMA_31, llama31, llama31_gguf, tmp_path, mistake)

