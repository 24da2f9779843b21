"""What the converter matrix's further rows (tests/converters/more_architectures.py) found the audit got wrong, each
reproduced here with a hand-built GGUF of what llama.cpp's converter wrote, without the tools.

- gpt-oss (yarn with `truncate: false`): llama.cpp rounds YaRN's correction range whatever the model says, so its
  tables differ from the model's from position 4 on (> 1e-3); the audit called the file WRONG without naming why;
- Hunyuan-7B (NTK-alpha: `dynamic` with `alpha` 1000): the converter writes the stretched base
  10000 · 1000^(128/126) and a 262144-token context on purpose; the audit called both wrong (`wrong_freq_base`,
  `context_beyond_model`) where llama.cpp runs the model's own tables;
- OLMo-3 (`olmo2`: sliding layers beside full ones with YaRN): llama.cpp's loader leaves the sliding layers unscaled
  (rope_freq_scale_train_swa = 1), as the model does; the audit gave them the file's YaRN and called the correct GGUF
  WRONG (`scaling_not_in_model` on the sliding layers).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import write_gguf

GPT_OSS = {"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "hidden_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
           "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                               "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}}
GPT_OSS_GGUF = {"context_length": 131072, "embedding_length": 2880, "attention.head_count": 64,
                "attention.head_count_kv": 8, "attention.key_length": 64, "rope.freq_base": 150000.0,
                "rope.scaling.type": "yarn", "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096,
                "block_count": 2}
HUNYUAN = {"model_type": "hunyuan_v1_dense", "architectures": ["HunYuanDenseV1ForCausalLM"], "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768,
           "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0}}
STRETCHED_BASE = 10000.0 * 1000.0 ** (128 / 126)  # conversion/hunyuan.py: base * alpha ** (dim / (dim - 2))
HUNYUAN_GGUF = {"context_length": 262144, "embedding_length": 4096, "attention.head_count": 32,
                "attention.head_count_kv": 8, "attention.key_length": 128, "rope.freq_base": STRETCHED_BASE,
                "rope.scaling.type": "none", "rope.scaling.factor": 1.0, "block_count": 32}


def _with_rope(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    edited = copy.deepcopy(config)
    edited["rope_parameters"].update(changes)
    return edited


def test_a_gpt_oss_gguf_names_llama_cpps_rounded_yarn_range(tmp_path: Path) -> None:
    """Before: WRONG from position 1, no mistake named. The rounding is the whole difference: against the same model
    with truncate=true the file is correct."""
    path = write_gguf(tmp_path / "gpt-oss.gguf", "gpt-oss", GPT_OSS_GGUF)
    result = audit_file(path, config=GPT_OSS)
    assert result.verdict == "wrong" and mistakes(result) == {"yarn_with_truncate"}, result.document()["facts"]
    [fact] = result.failing
    assert "ggml_rope_yarn_corr_dims" in fact.explanation
    rounded = audit_file(path, config=_with_rope(GPT_OSS, truncate=True))
    assert rounded.verdict == "correct" and not rounded.failing, rounded.document()["facts"]


def test_a_hunyuan_gguf_with_the_stretched_base_and_256k_is_correct(tmp_path: Path) -> None:
    """Before: WRONG wrong_freq_base (the file's base against rope_theta 10000) and context_beyond_model (262144
    against 32768)."""
    path = write_gguf(tmp_path / "hunyuan.gguf", "hunyuan-dense", HUNYUAN_GGUF)
    result = audit_file(path, config=HUNYUAN)
    assert result.verdict == "correct" and not result.failing, result.document()["facts"]
    [context] = [fact for fact in result.facts if fact.name == "context_length"]
    assert context.verdict == "note" and "conversion/hunyuan.py" in context.explanation


def test_a_hunyuan_gguf_of_another_base_or_context_is_still_wrong(tmp_path: Path) -> None:
    """The convention is the converter's exact output: rope_theta written as the base is wrong_freq_base, and the
    262144-token context of a model without NTK-alpha is beyond it."""
    unstretched = write_gguf(tmp_path / "base.gguf", "hunyuan-dense", {**HUNYUAN_GGUF, "rope.freq_base": 10000.0})
    assert mistakes(audit_file(unstretched, config=HUNYUAN)) == {"wrong_freq_base"}
    plain = {**HUNYUAN, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    unscaled = write_gguf(tmp_path / "plain.gguf", "hunyuan-dense", {**HUNYUAN_GGUF, "rope.freq_base": 10000.0})
    assert mistakes(audit_file(unscaled, config=plain)) == {"context_beyond_model"}


# Olmo-3-7B: sliding and full layers over base 500000, YaRN (factor 8 over 8192) on the full layers alone
OLMO3 = {"model_type": "olmo3", "architectures": ["Olmo3ForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 32, "max_position_embeddings": 65536, "sliding_window": 4096,
         "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
         "rope_parameters": {
             "full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0,
                                "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0},
             "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}}
OLMO3_GGUF = {"context_length": 65536, "embedding_length": 4096, "block_count": 4, "attention.head_count": 32,
              "attention.head_count_kv": 32, "rope.freq_base": 500000.0, "rope.freq_base_swa": 500000.0,
              "rope.scaling.type": "yarn", "rope.scaling.factor": 8.0, "rope.scaling.original_context_length": 8192,
              "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
              "attention.sliding_window": 4096}


def test_an_olmo3_gguf_leaves_its_sliding_layers_unscaled(tmp_path: Path) -> None:
    result = audit_file(write_gguf(tmp_path / "olmo3.gguf", "olmo2", OLMO3_GGUF), config=OLMO3)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    assert any("rope_freq_scale_train_swa = 1.0" in note for note in result.document()["notes"])
    wrong = audit_file(write_gguf(tmp_path / "base.gguf", "olmo2", {**OLMO3_GGUF, "rope.freq_base": 10000.0}),
                       config=OLMO3)
    assert mistakes(wrong) == {"wrong_freq_base"}
    unscaled = {key: value for key, value in OLMO3_GGUF.items() if not key.startswith("rope.scaling")}
    assert mistakes(audit_file(write_gguf(tmp_path / "plain.gguf", "olmo2", unscaled), config=OLMO3)) == {
        "scaling_missing"}
