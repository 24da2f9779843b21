"""A verdict is wrong only when a fact is wrong (issue 56): a checkpoint that stores no inv_freq (transformers >=
4.31) is judged from its config.json, and a reference guessed by shape alone never turns a file WRONG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from posenc.service.cli.main import main
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import SMALL_LLAMA3, llama3_rope_factors, llama_gguf_meta, write_gguf

# DeepSeek-Coder-6.7B's position facts on CodeLlama-7B's shapes: base 100000, linear scaling x4, 16384 positions
DEEPSEEK_LIKE = {**llama_gguf_meta(16384, 100000.0, kv=32), "rope.scaling.type": "linear", "rope.scaling.factor": 4.0}


def _modern_checkpoint(folder: Path) -> tuple[Path, Path]:
    """A tiny Llama-like state dict as transformers >= 4.31 saves it (no rotary_emb.inv_freq), and its config."""
    hidden, kv = SMALL_LLAMA3["hidden_size"], 128
    state = {"model.embed_tokens.weight": np.zeros((16, hidden), np.float32),
             "model.layers.0.self_attn.q_proj.weight": np.zeros((hidden, hidden), np.float32),
             "model.layers.0.self_attn.k_proj.weight": np.zeros((kv, hidden), np.float32),
             "model.norm.weight": np.ones(hidden, np.float32)}
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(SMALL_LLAMA3))
    return folder / "model.safetensors", folder / "config.json"


def test_a_checkpoint_without_inv_freq_is_judged_from_its_config(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Before: WRONG, partial_rotary_dim_wrong (rotary_dim missing) and tables of base 10000, exit 1."""
    checkpoint, config = _modern_checkpoint(tmp_path)
    result = audit_file(checkpoint, config=json.loads(config.read_text()))
    assert result.verdict == "consistent" and not result.failing, result.document()["facts"]
    rotary = {f.name: f for f in result.facts}["rotary_dim"]
    assert rotary.verdict == "note" and "not in this file" in rotary.explanation
    assert "config.json" in rotary.explanation and result.divergence is None
    assert main(["audit", str(checkpoint), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "CONSISTENT" in out and "not in this file — judged from the given config.json" in out


def test_a_guess_by_shape_never_turns_a_file_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: matched to codellama-7b by its shapes, WRONG wrong_freq_base + scaling_not_in_model, exit 1."""
    path = write_gguf(tmp_path / "deepseek.gguf", "llama", DEEPSEEK_LIKE)
    result = audit_file(path)
    assert result.reference.guessed and result.reference.fits[0] == "codellama-7b"
    assert result.verdict == "consistent" and mistakes(result) == set(), result.document()["facts"]
    noted = {f.name: f.explanation for f in result.facts if f.verdict == "note"}
    assert noted["rope_theta"].startswith("wrong_freq_base if the model is codellama-7b")
    assert noted["scaling.type"].startswith("scaling_not_in_model if the model is codellama-7b")
    doc = result.document()
    assert doc["verdict"] == "consistent" and doc["mistakes"] == []
    assert doc["reference"]["chosen_by"] == "shape" and {"codellama-7b", "llama-2-7b"} <= set(doc["reference"]["fits"])
    assert main(["audit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "CONSISTENT" in out and "assumed by shape" in out and "presets that fit: codellama-7b" in out
    assert "--preset NAME or --config config.json" in out and "tables against the assumed preset" in out
    assert main(["audit", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reference"]["fits"] == doc["reference"]["fits"]


def test_a_guessed_file_that_contradicts_itself_is_still_wrong(tmp_path: Path) -> None:
    short = {"rope_freqs.weight": llama3_rope_factors(100000.0, 128, 8.0, 1.0, 4.0, 4096)[:10]}
    result = audit_file(write_gguf(tmp_path / "short.gguf", "llama", DEEPSEEK_LIKE, short))
    assert result.reference.guessed and result.verdict == "wrong"
    assert mistakes(result) == {"frequency_factors_wrong"}, result.document()["facts"]


def test_a_named_reference_still_names_the_mistake(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_gguf(tmp_path / "deepseek.gguf", "llama", DEEPSEEK_LIKE)
    by_preset = audit_file(path, preset="codellama-7b")
    assert by_preset.verdict == "wrong" and mistakes(by_preset) == {"wrong_freq_base", "scaling_not_in_model"}
    config = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
              "max_position_embeddings": 16384, "rope_theta": 1000000.0,
              "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    by_config = audit_file(path, config=config)
    assert by_config.verdict == "wrong" and mistakes(by_config) == {"wrong_freq_base"}, by_config.document()["facts"]
    right = audit_file(path, config={**config, "rope_theta": 100000.0})
    assert right.verdict == "correct", right.document()["facts"]
    assert main(["audit", str(path), "--preset", "codellama-7b"]) == 1
    assert "-> wrong_freq_base" in capsys.readouterr().out


def test_a_checkpoint_with_inv_freq_of_another_base_is_still_wrong(tmp_path: Path) -> None:
    from posenc.models.rope_frequencies import default_inv_freq

    path = tmp_path / "with_buffer.safetensors"
    save_file({"model.layers.0.self_attn.rotary_emb.inv_freq": default_inv_freq(10000.0, 64).astype(np.float32)},
              str(path))
    result = audit_file(path, config=SMALL_LLAMA3)
    assert result.verdict == "wrong" and any(m.startswith("wrong_theta") for m in mistakes(result))
