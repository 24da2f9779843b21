"""Gemma-3 and Gemma-4 through the real converters: transformers 5 writes their RoPE per layer type
(`rope_parameters.full_attention` and `.sliding_attention`), llama.cpp's converter writes the full layers' base as
`freq_base` and the sliding layers' as `freq_base_swa` (Gemma-4: its proportional partial rotary as a `rope_freqs`
mask over a whole head of 512), onnxruntime-genai's builder one cache pair per layer type."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.converters.checkpoints import Model, save_checkpoint
from tests.converters.matrix import Mistake, assert_correct, check_mistake
from tests.converters.tools import build_onnx, convert_to_gguf, record_refusal

LAYER_TYPES = ["sliding_attention", "full_attention"]
GEMMA_3 = Model("gemma-3", "Gemma3TextConfig", "Gemma3ForCausalLM", preset="gemma-3-4b-it", config=dict(
    vocab_size=512, hidden_size=2560, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
    query_pre_attn_scalar=256, intermediate_size=64, num_hidden_layers=2, layer_types=LAYER_TYPES,
    sliding_window=1024, max_position_embeddings=131072,
    rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}))
GEMMA_4 = Model("gemma-4", "Gemma4TextConfig", "Gemma4ForCausalLM", preset="gemma-4-26b-a4b", config=dict(
    vocab_size=512, vocab_size_per_layer_input=512, hidden_size=2816, num_attention_heads=16, num_key_value_heads=8,
    head_dim=256, global_head_dim=512, intermediate_size=64, num_hidden_layers=2, layer_types=LAYER_TYPES,
    sliding_window=1024, max_position_embeddings=262144, hidden_size_per_layer_input=0,
    rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1000000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}))

GEMMA_3_MISTAKES = [
    Mistake("freq_base_swa overwritten with the full layers' 1000000", "convert_hf_to_gguf.py",
            frozenset({"wrong_freq_base"}), key="gemma3.rope.freq_base_swa", value=1000000.0),
    Mistake("freq_base overwritten with llama.cpp's default 10000", "convert_hf_to_gguf.py",
            frozenset({"wrong_freq_base"}), key="gemma3.rope.freq_base", value=10000.0),
]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory, sentencepiece_files: Path) -> Path:
    return save_checkpoint(GEMMA_3, tmp_path_factory.mktemp("gemma-3"), sentencepiece_files)


@pytest.fixture(scope="module")
def gemma3_gguf(gemma3: Path) -> Path:
    return convert_to_gguf(gemma3, gemma3.parent / "gemma-3.gguf")


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory: pytest.TempPathFactory, sentencepiece_files: Path) -> Path:
    return save_checkpoint(GEMMA_4, tmp_path_factory.mktemp("gemma-4"), sentencepiece_files)


@pytest.mark.parametrize(("model", "fixture"), [(GEMMA_3, "gemma3"), (GEMMA_4, "gemma4")], ids=["3", "4"])
def test_the_checkpoint_is_correct(model: Model, fixture: str, request: pytest.FixtureRequest) -> None:
    checkpoint: Path = request.getfixturevalue(fixture)
    for artifact in (checkpoint / "config.json", checkpoint / "model.safetensors"):
        assert_correct(model, checkpoint, artifact)


def test_the_gemma3_gguf_is_correct(gemma3: Path, gemma3_gguf: Path) -> None:
    assert_correct(GEMMA_3, gemma3, gemma3_gguf)


def test_the_gemma4_gguf_is_correct(gemma4: Path) -> None:
    assert_correct(GEMMA_4, gemma4, convert_to_gguf(gemma4, gemma4.parent / "gemma-4.gguf"))


@pytest.mark.parametrize(("model", "fixture", "error"), [
    (GEMMA_3, "gemma3", "KeyError: 'rope_type'"), (GEMMA_4, "gemma4", "is not currently supported")], ids=["3", "4"])
def test_the_builder_does_not_build_them(model: Model, fixture: str, error: str,
                                        request: pytest.FixtureRequest) -> None:
    """onnxruntime-genai 0.18.0 reads `config.rope_parameters["rope_type"]`, which transformers 5 nests per layer
    type for Gemma-3 (any Gemma-3 config, the Hub's transformers-4 spelling included, loads so): the build stops
    with a KeyError. It builds Gemma-4 from the multimodal Gemma4ForConditionalGeneration alone and refuses a
    text-only Gemma4ForCausalLM. When a pinned builder builds them, audit its models here instead."""
    checkpoint: Path = request.getfixturevalue(fixture)
    result = build_onnx(checkpoint, checkpoint.parent / "onnx")
    assert result.returncode != 0 and error in result.stderr, result.stderr[-3000:]
    record_refusal(model, "onnxruntime-genai builder",
                   result.stderr.strip().splitlines()[-1].replace(str(checkpoint), model.name))


@pytest.mark.parametrize("mistake", GEMMA_3_MISTAKES, ids=lambda m: m.id)
def test_a_gemma3_mistake_is_named(mistake: Mistake, gemma3: Path, gemma3_gguf: Path, tmp_path: Path) -> None:
    check_mistake(GEMMA_3, gemma3, gemma3_gguf, tmp_path, mistake)
