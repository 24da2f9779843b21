"""safetensors checkpoints (inv_freq buffers, a learned wpe, ALiBi slopes) and config.json alone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from posenc.models.alibi import alibi_slopes
from posenc.models.presets import find_preset
from posenc.models.rope import inv_freq_and_attention_factor
from posenc.models.rope_config import rope_parameters_from_config
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import SMALL_LLAMA3

GPT2 = {"model_type": "gpt2", "n_positions": 1024, "n_embd": 768, "n_head": 12}


def _checkpoint(path: Path, tensors: dict[str, np.ndarray]) -> Path:
    save_file({"model.embed_tokens.weight": np.zeros((16, 8), np.float32), **tensors}, str(path))
    return path


def test_inv_freq_buffers(tmp_path: Path) -> None:
    params, _ = rope_parameters_from_config(SMALL_LLAMA3)
    inv_freq, _ = inv_freq_and_attention_factor(params)
    buffers = {f"model.layers.{i}.self_attn.rotary_emb.inv_freq": inv_freq for i in range(2)}
    good = audit_file(_checkpoint(tmp_path / "good.safetensors", buffers), config=SMALL_LLAMA3)
    assert good.verdict == "correct", good.document()["facts"]
    wrong, _ = inv_freq_and_attention_factor(dataclasses.replace(params, rope_theta=10000.0))
    bad = audit_file(_checkpoint(tmp_path / "bad.safetensors", {"model.layers.0.self_attn.rotary_emb.inv_freq": wrong}),
                     config=SMALL_LLAMA3)
    assert mistakes(bad) == {"wrong_theta"}


def test_learned_wpe(tmp_path: Path) -> None:
    good = audit_file(_checkpoint(tmp_path / "good.safetensors", {"transformer.wpe.weight": np.zeros((1024, 768),
                                                                                                      np.float32)}),
                      config=GPT2)
    assert good.verdict == "correct", good.document()["facts"]
    short = audit_file(_checkpoint(tmp_path / "short.safetensors", {"transformer.wpe.weight": np.zeros((512, 768),
                                                                                                        np.float32)}),
                       config=GPT2)
    assert mistakes(short) == {"learned_table_shorter_than_context"}


def test_stored_alibi_slopes(tmp_path: Path) -> None:
    good = audit_file(_checkpoint(tmp_path / "good.safetensors", {"alibi_slopes": alibi_slopes(12).astype(np.float32)}),
                      preset="bloom-560m")
    assert good.verdict == "correct", good.document()["facts"]
    reversed_ = alibi_slopes(12)[::-1].astype(np.float32).copy()
    bad = audit_file(_checkpoint(tmp_path / "bad.safetensors", {"alibi_slopes": reversed_}), preset="bloom-560m")
    assert mistakes(bad) == {"alibi_slopes_wrong"}


def _config_file(tmp_path: Path, config: dict[str, object]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_config_alone(tmp_path: Path) -> None:
    config = dict(find_preset("llama-3.1-8b").config)
    assert audit_file(_config_file(tmp_path, config), preset="llama-3.1-8b").verdict == "correct"
    dropped = {k: v for k, v in config.items() if k != "rope_scaling"}
    result = audit_file(_config_file(tmp_path, dropped), preset="llama-3.1-8b")
    assert "scaling_missing" in mistakes(result) and result.divergence is not None
    assert not result.divergence.within_contract


def test_config_warnings(tmp_path: Path) -> None:
    legacy = {**SMALL_LLAMA3, "rope_scaling": {k if k != "rope_type" else "type": v
                                               for k, v in SMALL_LLAMA3["rope_scaling"].items()}}  # type: ignore[union-attr]
    result = audit_file(_config_file(tmp_path, legacy))
    notes = {f.name for f in result.facts if f.verdict == "note"}
    assert "rope_scaling.type" in notes
    no_original = {**SMALL_LLAMA3, "rope_scaling": {k: v for k, v in SMALL_LLAMA3["rope_scaling"].items()  # type: ignore[union-attr]
                                                    if k != "original_max_position_embeddings"}}
    assert "original_max_position_embeddings" in {f.name for f in audit_file(_config_file(tmp_path, no_original)).facts}
    unknown = {**SMALL_LLAMA3, "rope_scaling": {"rope_type": "su", "factor": 2.0}}
    assert mistakes(audit_file(_config_file(tmp_path, unknown))) == {"config_not_buildable"}
