"""Qwen2 with yarn scaling (Qwen2.5-7B-Instruct's long-context setting) and Phi-3.5-mini's longrope (short and long
factor sets, original context 4096) through the real converters."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from posenc.models.presets import find_preset
from tests.converters.checkpoints import Model, edited_copy, save_checkpoint
from tests.converters.matrix import (
    Mistake,
    assert_correct,
    assert_named,
    audited,
    check_mistake,
    references,
    swapped_longrope,
    without,
)
from tests.converters.tools import build_onnx, convert_to_gguf, record_refusal

QWEN2_YARN = Model("qwen2-yarn", "Qwen2Config", "Qwen2ForCausalLM", preset="qwen2.5-7b-instruct-yarn", config=dict(
    vocab_size=512, hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=64,
    num_hidden_layers=1, max_position_embeddings=32768,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768,
                     "rope_theta": 1000000.0}))
# Phi-3.5-mini's config.json as the hub holds it (rope_scaling with the legacy key `type`, the 48 short and 48 long
# factors; the catalogue's copy), loaded and saved by transformers 5: rope_parameters keeps `type` beside
# `rope_type`, and onnxruntime-genai's Phi-3 longrope builder reads `type` (a config that has only `rope_type`
# stops it with KeyError: 'type')
PHI_SCALING = dict(find_preset("phi-3.5-mini-instruct").config["rope_scaling"])
PHI_35 = Model("phi-3.5", "Phi3Config", "Phi3ForCausalLM", preset="phi-3.5-mini-instruct", config=dict(
    vocab_size=512, hidden_size=3072, num_attention_heads=32, num_key_value_heads=32, intermediate_size=64,
    num_hidden_layers=1, max_position_embeddings=131072, original_max_position_embeddings=4096, bos_token_id=1,
    eos_token_id=2, pad_token_id=0, rope_theta=10000.0, rope_scaling=PHI_SCALING))

MISTAKES = [
    (QWEN2_YARN, Mistake("yarn scaling dropped from config.json", "convert_hf_to_gguf.py",
                         frozenset({"scaling_missing"}), edit=without("rope_type", "factor",
                                                                      "original_max_position_embeddings"),
                         config_named=frozenset({"scaling_missing"}))),
    (PHI_35, Mistake("longrope short and long factors swapped in config.json", "convert_hf_to_gguf.py",
                     frozenset({"longrope_short_long_swapped"}), edit=swapped_longrope,
                     config_named=frozenset({"longrope_short_long_swapped"}))),
    (PHI_35, Mistake("longrope short and long factors swapped in config.json", "onnxruntime-genai builder",
                     frozenset({"longrope_short_long_swapped"}), edit=swapped_longrope)),
]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, sentencepiece_files: Path) -> dict[str, Path]:
    return {model.name: save_checkpoint(model, tmp_path_factory.mktemp(model.name), sentencepiece_files)
            for model in (QWEN2_YARN, PHI_35)}


@pytest.fixture(scope="module")
def ggufs(checkpoints: dict[str, Path]) -> dict[str, Path]:
    return {name: convert_to_gguf(folder, folder.parent / f"{name}.gguf") for name, folder in checkpoints.items()}


@pytest.mark.parametrize("model", [QWEN2_YARN, PHI_35], ids=lambda m: m.name)
def test_the_checkpoint_and_gguf_are_correct(model: Model, checkpoints: dict[str, Path],
                                             ggufs: dict[str, Path]) -> None:
    checkpoint = checkpoints[model.name]
    for artifact in (checkpoint / "config.json", checkpoint / "model.safetensors", ggufs[model.name]):
        assert_correct(model, checkpoint, artifact)


def test_the_phi35_onnx_model_is_correct(checkpoints: dict[str, Path]) -> None:
    checkpoint = checkpoints[PHI_35.name]
    result = build_onnx(checkpoint, checkpoint.parent / "onnx")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_correct(PHI_35, checkpoint, checkpoint.parent / "onnx" / "model.onnx")


def test_the_qwen2_yarn_onnx_model_has_the_builders_own_ramp(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """onnxruntime-genai 0.18.0 reads yarn's beta_fast and beta_slow as 0 where the config leaves them to
    transformers' defaults (32 and 1; Qwen2.5's model card leaves them out) and stops dividing by zero; with the
    defaults written out it builds, and its caches carry its own yarn ramp, computed without transformers' rounding
    of the correction range to whole dims (up to 2.28 off at long positions): a divergence of the tool itself,
    named `yarn_without_truncate`."""
    checkpoint = checkpoints[QWEN2_YARN.name]
    refused = build_onnx(checkpoint, tmp_path / "onnx")
    assert refused.returncode != 0 and "ZeroDivisionError" in refused.stderr, refused.stderr[-3000:]
    record_refusal(QWEN2_YARN, "onnxruntime-genai builder", refused.stderr.strip().splitlines()[-1])
    written_out = edited_copy(checkpoint, tmp_path / "betas", with_yarn_betas)
    result = build_onnx(written_out, tmp_path / "onnx-betas")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    for reference, label in references(QWEN2_YARN, checkpoint):
        assert_named(audited(QWEN2_YARN, tmp_path / "onnx-betas" / "model.onnx", reference, label,
                             mistake="none (beta_fast 32, beta_slow 1 written out)"),
                     {"yarn_without_truncate"}, f"the Qwen2 yarn ONNX model against {label}")


def with_yarn_betas(config: dict[str, Any]) -> dict[str, Any]:
    """transformers' yarn defaults written into the config (what it computes with when they are left out)."""
    return {**config, "rope_parameters": {**config["rope_parameters"], "beta_fast": 32.0, "beta_slow": 1.0}}


@pytest.mark.parametrize(("model", "mistake"), MISTAKES, ids=lambda m: m.id if isinstance(m, Mistake) else m.name)
def test_a_mistake_is_named(model: Model, mistake: Mistake, checkpoints: dict[str, Path], ggufs: dict[str, Path],
                            tmp_path: Path) -> None:
    check_mistake(model, checkpoints[model.name], ggufs[model.name], tmp_path, mistake)
