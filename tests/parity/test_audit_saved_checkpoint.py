"""`posenc audit` on a checkpoint transformers itself saved (issue 56): since transformers 4.31 `inv_freq` is a
non-persistent buffer, so the checkpoint stores no position tensor and is judged from its config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.service.audit.run import read_path, run
from posenc.service.cli.main import main
from posenc.service.settings import Settings


def test_a_llama_checkpoint_saved_by_transformers_is_consistent_with_its_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path, safe_serialization=True)
    checkpoint = tmp_path / "model.safetensors"
    found = read_path(checkpoint, Settings())
    assert found.inv_freq is None and found.rotary_dim is None  # nothing of the position handling is stored
    result = run(found, None, json.loads((tmp_path / "config.json").read_text()))
    assert result.verdict == "consistent" and not result.failing, result.document()["facts"]
    assert main(["audit", str(checkpoint), "--config", str(tmp_path / "config.json")]) == 0
    assert "not in this file — judged from the given config.json" in capsys.readouterr().out
