"""llama.cpp's conventions (`posenc.models.audit.llama_cpp`) applied to GGUF files: what its loader assumes for an
absent key, the `rope_freqs` mask of unrotated pairs, and the keys of the sliding-window layers. A file that
llama.cpp runs as the model runs is no mistake, and the audit quotes the convention it applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from posenc.models.audit.layers import LayeredAudit
from posenc.models.audit.llama_cpp import UNROTATED_FACTOR, WRITTEN_MASK, convention
from posenc.service.audit.run import read_path
from posenc.service.settings import Settings
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import write_gguf

# Gemma-3 4B as convert_hf_to_gguf.py writes it, minus rope.freq_base_swa (older converters never wrote it)
GEMMA3 = {"context_length": 131072, "embedding_length": 2560, "attention.head_count": 8, "attention.key_length": 256,
          "rope.freq_base": 1e6, "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}
GEMMA3_V4 = {"model_type": "gemma3_text", "hidden_size": 2560, "num_attention_heads": 8, "head_dim": 256,
             "max_position_embeddings": 131072, "rope_theta": 1e6,
             "rope_scaling": {"factor": 8.0, "rope_type": "linear"}}
# Gemma-4 26B-A4B: the full-attention layers rotate 128 of 512 channels ("proportional", partial 0.25); the
# converter writes dimension_count = global_head_dim and marks the 192 unrotated pairs with rope_freqs = 1e30
GEMMA4 = {"context_length": 262144, "embedding_length": 2816, "attention.head_count": 16,
          "attention.key_length": 512, "attention.key_length_swa": 256, "rope.dimension_count": 512,
          "rope.dimension_count_swa": 256, "rope.freq_base": 1e6, "rope.freq_base_swa": 10000.0}


def _mask(pairs: int, rotated: int) -> dict[str, np.ndarray]:
    return {"rope_freqs.weight": np.array([1.0] * rotated + [WRITTEN_MASK] * (pairs - rotated), dtype=np.float32)}


def _notes(result: Any) -> str:
    return "\n".join(result.found.notes)


def test_the_table_names_a_llama_cpp_source_for_each_convention() -> None:
    for arch, key in (("gemma3", "rope.freq_base_swa"), ("llama", "rope.freq_base"), ("llama", "rope.scaling.type"),
                      ("llama", "rope.freq_base_swa"), ("gemma4", "rope.dimension_count_swa"),
                      ("gemma4", "attention.key_length_swa")):
        entry = convention(arch, key)
        assert entry is not None and entry.source.startswith(("src/llama-model.cpp", "src/models/")), (arch, key)
    assert convention("gemma3", "rope.freq_base_swa").source.startswith(  # type: ignore[union-attr]
        "src/models/gemma3.cpp, llama_model_gemma3::load_arch_hparams: get_key(LLM_KV_ROPE_FREQ_BASE_SWA")
    assert convention("gemma3", "rope.freq_base_swa").value == 10000.0  # type: ignore[union-attr]
    assert WRITTEN_MASK >= UNROTATED_FACTOR


def test_gemma3_without_freq_base_swa_gets_llama_cpps_10000(tmp_path: Path) -> None:
    """Before: theta_swa None, and against Gemma-3's config.json (rope_local_base_freq 10000) WRONG
    sliding_window_base_missing. llama.cpp's gemma3 loader gives the sliding layers 10000 when the key is absent."""
    path = write_gguf(tmp_path / "gemma3.gguf", "gemma3", GEMMA3)
    result = audit_file(path, preset="gemma-3-4b-it")
    assert result.verdict == "correct", result.document()["facts"]
    assert result.found.theta_swa == 10000.0
    assert "gemma3.rope.freq_base_swa absent: llama.cpp uses 10000 for the sliding layers (src/models/gemma3.cpp" \
        in _notes(result)
    assert isinstance(result, LayeredAudit) and result.layer_verdict("sliding_attention") == "correct"
    # Gemma-3's config.json as transformers 4 wrote it: one RoPE, the sliding layers' base in rope_local_base_freq
    config = {**GEMMA3_V4, "rope_local_base_freq": 10000.0}
    against_config = audit_file(path, config=config)
    assert "sliding_window_base_missing" not in mistakes(against_config), against_config.document()["facts"]
    assert against_config.verdict == "correct"
    assert {f.name: f.verdict for f in against_config.facts}["rope_theta_swa"] == "ok"


def test_a_wrong_gemma3_swa_base_is_read_as_llama_cpp_reads_it(tmp_path: Path) -> None:
    """Before: a note said llama.cpp uses 10000 for Gemma-3's sliding layers whatever the file says, beside a verdict
    that judged the file's 1e6 (the pinned llama.cpp's gemma3 loader reads freq_base_swa: the file is wrong)."""
    result = audit_file(write_gguf(tmp_path / "gemma3.gguf", "gemma3", {**GEMMA3, "rope.freq_base_swa": 1e6}),
                        preset="gemma-3-4b-it")
    assert isinstance(result, LayeredAudit) and result.layer_verdict("full_attention") == "correct"
    failing = {f.name: f for f in result.layers["sliding_attention"].failing}
    assert set(failing) == {"rope_theta"} and failing["rope_theta"].mistake == "wrong_freq_base"
    assert "freq_base_swa" in failing["rope_theta"].explanation, failing["rope_theta"].explanation
    assert "whatever" not in _notes(result) and "uses 10000" not in _notes(result)


def test_gemma4_without_freq_base_swa_gets_llama_cpps_10000(tmp_path: Path) -> None:
    """Before: the sliding layers took freq_base (1e6), WRONG sliding_window_base_missing; llama.cpp's gemma4 loader
    gives them 10000 when the key is absent."""
    meta = {key: value for key, value in GEMMA4.items() if key != "rope.freq_base_swa"}
    result = audit_file(write_gguf(tmp_path / "gemma4.gguf", "gemma4", meta, _mask(256, 64)),
                        preset="gemma-4-26b-a4b")
    assert result.verdict == "correct", result.document()["facts"]
    assert result.found.theta_swa == 10000.0
    assert "gemma4.rope.freq_base_swa absent: llama.cpp uses 10000 for the sliding layers" in _notes(result)


def test_a_missing_swa_base_elsewhere_is_still_named(tmp_path: Path) -> None:
    """An architecture whose loader gives the sliding layers freq_base when the key is absent (Cohere2, Llama 4,
    OLMo2, gpt-oss) keeps the mistake: the file does not carry the base its sliding layers need."""
    meta = {"context_length": 8192, "embedding_length": 512, "attention.head_count": 4, "attention.key_length": 128,
            "attention.key_length_swa": 128, "rope.freq_base": 1e6}
    config = {"model_type": "cohere2", "hidden_size": 512, "num_attention_heads": 4, "head_dim": 128,
              "max_position_embeddings": 8192, "num_hidden_layers": 2,
              "layer_types": ["sliding_attention", "full_attention"],
              "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    result = audit_file(write_gguf(tmp_path / "cohere2.gguf", "cohere2", meta), config=config)
    assert mistakes(result) == {"sliding_window_base_missing"}, result.document()["layer_types"]
    assert result.found.theta_swa is None
    assert "cohere2.rope.freq_base_swa absent: llama.cpp gives the sliding layers rope.freq_base" in _notes(result)


def test_a_scaling_factor_without_a_type_is_linear_as_llama_cpp_reads_it(tmp_path: Path) -> None:
    """Before: the factor was dropped (scaling_missing against Gemma-3). llama.cpp's loader defaults the type
    string to linear, so the factor scales every frequency."""
    meta = {key: value for key, value in GEMMA3.items() if key != "rope.scaling.type"}
    result = audit_file(write_gguf(tmp_path / "gemma3.gguf", "gemma3", meta), preset="gemma-3-4b-it")
    assert result.verdict == "correct", result.document()["facts"]
    assert result.found.scaling.get("factor") == 8.0
    assert "gemma3.rope.scaling.type absent: llama.cpp" in _notes(result)


def test_gemma4_rope_freqs_mask_is_its_partial_rotary(tmp_path: Path) -> None:
    """Before: rotary_dim 512, WRONG partial_rotary_dim_wrong while the tables agreed to 8e-27."""
    result = audit_file(write_gguf(tmp_path / "gemma4.gguf", "gemma4", GEMMA4, _mask(256, 64)),
                        preset="gemma-4-26b-a4b")
    assert result.found.rotary_dim == 128
    assert isinstance(result, LayeredAudit) and result.verdict == "correct", result.document()["layer_types"]
    assert all(layer.divergence is not None and layer.divergence.within_contract for layer in result.layers.values())
    assert "rope_freqs marks 192 of 256 pairs unrotated" in _notes(result)


def test_a_mask_over_the_last_half_of_the_pairs(tmp_path: Path) -> None:
    """dimension_count = head_dim = 128 and the last 32 of 64 pairs masked: 64 channels rotate."""
    meta = {"context_length": 8192, "embedding_length": 1024, "attention.head_count": 8, "attention.key_length": 128,
            "rope.dimension_count": 128, "rope.freq_base": 1e6}
    path = write_gguf(tmp_path / "half.gguf", "gemma4", meta, _mask(64, 32))
    assert read_path(path, Settings()).rotary_dim == 64
    config = {"model_type": "gemma4_text", "hidden_size": 1024, "num_attention_heads": 8, "head_dim": 128,
              "max_position_embeddings": 8192,
              "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1e6}}
    result = audit_file(path, config=config)
    assert "partial_rotary_dim_wrong" not in mistakes(result)
    assert result.verdict == "correct", result.document()["facts"]


def test_a_mask_with_unequal_factors_keeps_the_divisors(tmp_path: Path) -> None:
    """Unmasked factors that are not all 1 (a scaled head under a mask) are no whole-head RoPE: the divisors compute
    the table as llama.cpp does, and the note says how many channels rotate."""
    meta = {"context_length": 8192, "embedding_length": 1024, "attention.head_count": 8, "attention.key_length": 128,
            "rope.dimension_count": 128, "rope.freq_base": 1e6}
    factors = _mask(64, 32)["rope_freqs.weight"]
    factors[:32] = np.linspace(1.0, 4.0, 32, dtype=np.float32)
    found = read_path(write_gguf(tmp_path / "scaled.gguf", "gemma4", meta, {"rope_freqs.weight": factors}),
                      Settings())
    assert found.rotary_dim == 128 and found.freq_factors is not None
    assert any("rope_freqs marks 32 of 64 pairs unrotated" in note for note in found.notes)


def test_a_factor_of_exactly_the_threshold_leaves_its_pair_unrotated(tmp_path: Path) -> None:
    """rope_freqs is F32: a factor of UNROTATED_FACTOR (1e20 as float32, the value the comparison takes it at) masks
    its pair, as the written 1e30 does; the float32 just below it is a divisor like any other."""
    meta = {"context_length": 8192, "embedding_length": 1024, "attention.head_count": 8, "attention.key_length": 128,
            "rope.dimension_count": 128, "rope.freq_base": 1e6}
    at = np.float32(UNROTATED_FACTOR)
    factors = np.array([1.0] * 32 + [at] * 32, dtype=np.float32)
    path = write_gguf(tmp_path / "at.gguf", "gemma4", meta, {"rope_freqs.weight": factors})
    found = read_path(path, Settings())
    assert found.rotary_dim == 64 and found.freq_factors is None, found.notes
    assert any("rope_freqs marks 32 of 64 pairs unrotated" in note for note in found.notes), found.notes
    config = {"model_type": "gemma4_text", "hidden_size": 1024, "num_attention_heads": 8, "head_dim": 128,
              "max_position_embeddings": 8192,
              "rope_parameters": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1e6}}
    result = audit_file(path, config=config)
    assert result.verdict == "correct", result.document()["facts"]
    factors[32:] = np.nextafter(at, np.float32(0))
    below = read_path(write_gguf(tmp_path / "below.gguf", "gemma4", meta, {"rope_freqs.weight": factors}),
                      Settings())
    assert below.rotary_dim == 128 and below.freq_factors is not None
    assert not any("unrotated" in note for note in below.notes), below.notes


def test_the_swa_keys_are_read(tmp_path: Path) -> None:
    """Before: attention.key_length_swa and rope.dimension_count_swa were not read at all."""
    found = read_path(write_gguf(tmp_path / "gemma4.gguf", "gemma4", GEMMA4, _mask(256, 64)), Settings())
    notes = "\n".join(found.notes)
    assert found.theta_swa == 10000.0
    assert "sliding layers: gemma4.attention.key_length_swa = 256" in notes
    assert "gemma4.rope.dimension_count_swa = 256" in notes
    assert "gemma4.rope.freq_base_swa = 10000" in notes
    # absent, they take the full layers' values, as llama.cpp's loader does; said only where a _swa key is present
    meta = {key: value for key, value in GEMMA4.items() if key != "attention.key_length_swa"}
    found = read_path(write_gguf(tmp_path / "no_key_swa.gguf", "gemma4", meta, _mask(256, 64)), Settings())
    assert any("gemma4.attention.key_length_swa absent: llama.cpp gives the sliding layers attention.key_length "
               "(512)" in note for note in found.notes), found.notes
