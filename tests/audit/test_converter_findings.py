"""What the converter matrix (tests/converters: the real llama.cpp converter and onnxruntime-genai builder) found the
audit got wrong, each reproduced here with a hand-built file of what the tool wrote, without the tools.

- GPT-2 (learned absolute positions, no RoPE): its config.json was WRONG config_not_buildable, its GGUF stated a
  RoPE the model does not run;
- a config.json whose longrope short and long factors were exchanged was WRONG without a mistake named;
- onnxruntime-genai's caches of a Phi-2 whose partial_rotary_factor was dropped: `cache_values_differ` ("match no
  known mistake") beside the partial_rotary_dim_wrong the facts named;
- a Llama-3.1 converted without its rope_theta: rope_freqs said only to "not divide the base frequencies" where
  it holds the llama3 factors of the wrong base;
- a Falcon-7B config.json saved by transformers 5 (num_kv_heads 71 beside num_key_value_heads 1): the reference
  expected 71 KV heads of the multi-query model, and its GGUF (head_count_kv 1) was WRONG head_count_wrong.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np

from posenc.models.presets import find_preset
from posenc.service.cli.main import main
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import caches_of, genai_onnx, llama3_rope_factors, llama_gguf_meta, write_gguf

# GPT-2 as transformers 5 saves it (n_embd, n_head, n_positions: no head size, no RoPE key) and as the converter
# writes it (gpt2.* keys without rope, the learned table as position_embd [n_embd, n_positions])
GPT2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 768, "n_head": 12, "n_layer": 12,
        "n_positions": 1024, "n_ctx": 1024, "vocab_size": 50257}
GPT2_GGUF = {"context_length": 1024, "embedding_length": 768, "attention.head_count": 12, "block_count": 12}


def test_a_gpt2_config_is_learned_positions_not_an_unbuildable_rope(tmp_path: Path) -> None:
    """Before: WRONG config_not_buildable ("config.json has no head size"), exit 1, against itself."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2))
    result = audit_file(path, config=GPT2)
    assert result.verdict == "correct" and not result.failing, result.document()["facts"]
    assert result.found.learned_positions == (1024,) and result.found.context_length == 1024
    assert main(["audit", str(path), "--config", str(path)]) == 0
    # n_positions beside a RoPE key is a RoPE model's (GPT-J's rotary_dim)
    gptj = _write(tmp_path / "gptj.json", {**GPT2, "model_type": "gptj", "rotary_dim": 64})
    assert audit_file(gptj).found.learned_positions is None


def test_a_gpt2_gguf_states_its_learned_table_and_no_rope(tmp_path: Path) -> None:
    """Before: CORRECT, with a `rope_metadata` fact of base 10000 over the whole head and the note that llama.cpp
    uses rope.freq_base 10000 (GPT-2's graph has no RoPE); now its learned table is the position fact."""
    table = {"position_embd.weight": np.zeros((1024, 768), np.float32)}  # ggml's [n_embd, n_positions]
    path = write_gguf(tmp_path / "gpt2.gguf", "gpt2", GPT2_GGUF, table)
    result = audit_file(path, config=GPT2)
    assert result.verdict == "correct" and not result.failing, result.document()["facts"]
    facts = {f.name: f for f in result.facts}
    assert "rope_metadata" not in facts and facts["learned positions (position_embd.weight)"].verdict == "ok"
    notes = "\n".join(result.found.notes)
    assert "no RoPE: position_embd.weight holds 1024 learned absolute positions" in notes and "freq_base" not in notes
    overwritten = write_gguf(tmp_path / "long.gguf", "gpt2", {**GPT2_GGUF, "context_length": 2048}, table)
    assert mistakes(audit_file(overwritten, config=GPT2)) == {"context_beyond_model"}


def _phi35() -> dict[str, Any]:
    """Phi-3.5-mini's config.json as transformers 5 saves it (the catalogue's copy, rope_parameters)."""
    config = copy.deepcopy(dict(find_preset("phi-3.5-mini-instruct").config))
    scaling = config.pop("rope_scaling")
    config["rope_parameters"] = {**scaling, "rope_type": "longrope", "rope_theta": config.pop("rope_theta")}
    return config


def test_a_config_with_longrope_factors_exchanged_names_the_swap(tmp_path: Path) -> None:
    """Before: WRONG with no mistake named (the config's factor lists were not compared, only the tables)."""
    true, swapped = _phi35(), _phi35()
    params = swapped["rope_parameters"]
    params["short_factor"], params["long_factor"] = params["long_factor"], params["short_factor"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(swapped))
    for result in (audit_file(path, config=true), audit_file(path, preset="phi-3.5-mini-instruct")):
        assert result.verdict == "wrong" and mistakes(result) == {"longrope_short_long_swapped"}, \
            result.document()["facts"]
        facts = {f.name: f for f in result.failing}
        assert set(facts) == {"short_factor", "long_factor"}
        assert "lists short_factor and long_factor are exchanged" in facts["short_factor"].explanation
    changed = _phi35()
    changed["rope_parameters"]["long_factor"] = [1.0] * 48
    assert mistakes(audit_file(_write(tmp_path / "other.json", changed), config=true)) == {"scaling_factors_wrong"}
    assert audit_file(_write(tmp_path / "same.json", true), config=true).verdict == "correct"


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(json.dumps(config))
    return path


def test_onnx_caches_of_another_rotary_dim_name_the_partial_rotary(tmp_path: Path) -> None:
    """Before: cache_values was `cache_values_differ` ("the caches match no known mistake") beside rotary_dim's
    partial_rotary_dim_wrong. Phi-2 (head 80, partial 0.4: 32 channels) built from a config without its
    partial_rotary_factor: transformers' PhiConfig default 0.5, caches of 40 channels."""
    phi2 = {"model_type": "phi", "hidden_size": 320, "num_attention_heads": 4, "max_position_embeddings": 2048,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4}}
    dropped = {**phi2, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                           "partial_rotary_factor": 0.5}}
    path = tmp_path / "model.onnx"
    path.write_bytes(genai_onnx(*caches_of(dropped, 2048, np.float32), heads=4, kv_heads=4))
    result = audit_file(path, config=phi2)
    assert mistakes(result) == {"partial_rotary_dim_wrong"}, result.document()["facts"]
    values = next(f for f in result.facts if f.name == "cache_values")
    assert values.explanation.startswith("the caches rotate 40 channels of each head"), values.explanation


def test_llama3_factors_of_the_wrong_base_say_so(tmp_path: Path) -> None:
    """A Llama-3.1 config.json without rope_theta converted: freq_base 10000 (the converter's default) and rope_freqs
    computed for base 10000. Before: rope_freqs "does not divide the base frequencies into the llama3 ones"; now
    it says whose factors they are."""
    meta = llama_gguf_meta(131072, 10000.0)
    factors = llama3_rope_factors(10000.0, 128, 8.0, 1.0, 4.0, 8192)
    result = audit_file(write_gguf(tmp_path / "llama.gguf", "llama", meta, {"rope_freqs.weight": factors}),
                        preset="llama-3.1-8b")
    assert mistakes(result) == {"wrong_freq_base", "frequency_factors_wrong"}, result.document()["facts"]
    freqs = next(f for f in result.facts if f.name == "rope_freqs")
    assert freqs.explanation.startswith("rope_freqs holds the llama3 factors of base 10000 (the file's freq_base), "
                                        "not of the model's 500000"), freqs.explanation


def test_a_multi_query_falcon_saved_by_transformers_5_has_one_kv_head(tmp_path: Path) -> None:
    """Falcon-7B (multi_query, the old decoder) as transformers 5 saves its config.json: `num_kv_heads` 71 (its
    default, the head count) beside `num_key_value_heads` 1 (what FalconAttention runs: one KV head where
    multi_query and not new_decoder_architecture). The converter writes head_count_kv 1. Before: the reference read
    `num_kv_heads` first and the GGUF was WRONG head_count_wrong (expected 71)."""
    config = {"model_type": "falcon", "architectures": ["FalconForCausalLM"], "hidden_size": 4544,
              "num_attention_heads": 71, "num_kv_heads": 71, "num_key_value_heads": 1, "multi_query": True,
              "new_decoder_architecture": False, "max_position_embeddings": 2048,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    meta = {"context_length": 2048, "embedding_length": 4544, "attention.head_count": 71,
            "attention.head_count_kv": 1, "block_count": 32}
    path = write_gguf(tmp_path / "falcon.gguf", "falcon", meta)
    result = audit_file(path, config=config)
    assert result.verdict == "correct" and not result.failing, result.document()["facts"]
    assert result.reference.num_kv_heads == 1
    # the hub's Falcon-40B (new_decoder_architecture: num_kv_heads alone) still states its 8 KV heads
    hub_40b = {**config, "hidden_size": 8192, "num_attention_heads": 128, "num_kv_heads": 8,
               "new_decoder_architecture": True}
    hub_40b.pop("num_key_value_heads")
    assert audit_file(path, config=hub_40b).reference.num_kv_heads == 8
