"""GGUF files as llama.cpp's converter writes them: each correct one passes, each known bug is named."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from posenc.models.presets import find_preset
from tests.audit.conftest import audit_file, bytes_read, mistakes
from tests.audit_files import llama3_rope_factors, llama_gguf_meta, write_gguf

LLAMA31_FREQS = {"rope_freqs.weight": llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)}


def _phi35() -> tuple[dict[str, Any], dict[str, Any]]:
    config = find_preset("phi-3.5-mini-instruct").config
    rope = config["rope_scaling"]
    meta = {"context_length": 131072, "embedding_length": 3072, "attention.head_count": 32,
            "attention.head_count_kv": 32, "rope.dimension_count": 96, "rope.freq_base": 10000.0,
            "rope.scaling.original_context_length": 4096, "rope.scaling.attn_factor": 1.1902380714238083}
    return meta, rope


def test_llama31_correct_passes_and_without_rope_freqs_is_named(tmp_path: Path) -> None:
    good = audit_file(write_gguf(tmp_path / "good.gguf", "llama", llama_gguf_meta(131072, 500000.0), LLAMA31_FREQS))
    assert good.verdict == "consistent" and good.reference.label.startswith("preset llama-3.1-8b")  # a guess
    bad = audit_file(write_gguf(tmp_path / "bad.gguf", "llama", llama_gguf_meta(131072, 500000.0)),
                     preset="llama-3.1-8b")
    assert bad.verdict == "wrong" and mistakes(bad) == {"frequency_factors_missing"}
    assert bad.divergence is not None and bad.divergence.first_position is not None
    assert bad.divergence.max_abs > 1.0  # the low frequencies run 8x too fast: far out of phase by 131072


def test_codellama_freq_base_not_picked_up(tmp_path: Path) -> None:
    good = audit_file(write_gguf(tmp_path / "good.gguf", "llama", llama_gguf_meta(16384, 1e6, kv=32)))
    assert good.verdict == "consistent" and "codellama-7b" in good.reference.label  # a guess by shape
    bad = audit_file(write_gguf(tmp_path / "bad.gguf", "llama", llama_gguf_meta(16384, 10000.0, kv=32)),
                     preset="codellama-7b")
    assert mistakes(bad) == {"wrong_freq_base"}


@pytest.mark.parametrize(("scaling", "mistake"), [
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 32768}, None),
    ({}, "scaling_missing"),
    ({"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}, "scaling_missing"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 2.0, "rope.scaling.original_context_length": 32768},
     "scaling_factor_wrong"),
    ({"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 4096},
     "scaling_original_length_wrong"),
])
def test_yarn_scaling(tmp_path: Path, scaling: dict[str, Any], mistake: str | None) -> None:
    meta = {**llama_gguf_meta(32768, 1e6, hidden=3584, heads=28, kv=4), **scaling}
    result = audit_file(write_gguf(tmp_path / "qwen.gguf", "qwen2", meta), preset="qwen2.5-7b-instruct-yarn")
    assert mistakes(result) == ({mistake} if mistake else set()), result.document()["facts"]


def test_longrope_factors_and_swapped(tmp_path: Path) -> None:
    import numpy as np

    meta, rope = _phi35()
    long, short = np.asarray(rope["long_factor"], np.float32), np.asarray(rope["short_factor"], np.float32)
    good = audit_file(write_gguf(tmp_path / "good.gguf", "phi3", meta, {"rope_factors_long.weight": long,
                                                                        "rope_factors_short.weight": short}))
    assert good.verdict == "consistent" and "phi-3.5-mini" in good.reference.label, good.document()["facts"]
    swapped = audit_file(write_gguf(tmp_path / "swapped.gguf", "phi3", meta, {"rope_factors_long.weight": short,
                                                                             "rope_factors_short.weight": long}),
                         preset="phi-3.5-mini-instruct")
    assert mistakes(swapped) == {"longrope_short_long_swapped"}
    missing = audit_file(write_gguf(tmp_path / "missing.gguf", "phi3", meta), preset="phi-3.5-mini-instruct")
    assert mistakes(missing) == {"scaling_missing"}


def test_partial_rotary_dimension_wrong(tmp_path: Path) -> None:
    meta = {"context_length": 2048, "embedding_length": 768, "attention.head_count": 12, "rope.freq_base": 10000.0}
    good = audit_file(write_gguf(tmp_path / "good.gguf", "gptneox", {**meta, "rope.dimension_count": 16}),
                      preset="pythia-160m")
    assert good.verdict == "correct"
    bad = audit_file(write_gguf(tmp_path / "bad.gguf", "gptneox", {**meta, "rope.dimension_count": 64}),
                     preset="pythia-160m")
    assert "partial_rotary_dim_wrong" in mistakes(bad)


def test_mrope_sections(tmp_path: Path) -> None:
    meta = {**llama_gguf_meta(32768, 1e6, hidden=3584, heads=28, kv=4)}
    good = audit_file(write_gguf(tmp_path / "good.gguf", "qwen2vl",
                                 {**meta, "rope.dimension_sections": [16, 24, 24, 0]}))
    assert good.verdict == "consistent" and "qwen2-vl-7b" in good.reference.label  # a guess by shape
    bad = audit_file(write_gguf(tmp_path / "bad.gguf", "qwen2vl", {**meta, "rope.dimension_sections": [24, 20, 20, 0]}
                                ), preset="qwen2-vl-7b-instruct")
    assert mistakes(bad) == {"mrope_sections_wrong"}


def test_a_gemma3_file_without_its_sliding_window_base_has_llama_cpp_s(tmp_path: Path) -> None:
    """llama.cpp gives gemma3's sliding layers base 10000 whatever the file says (models/audit/llama_cpp.py): a file
    without the key is no mistake; another architecture's missing key still is (test_llama_cpp_conventions.py)."""
    config = {**find_preset("gemma-3-4b-it").config, "rope_local_base_freq": 10000.0}
    meta = {"context_length": 131072, "embedding_length": 2560, "attention.head_count": 8, "attention.key_length": 256,
            "rope.freq_base": 1e6, "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}
    good = audit_file(write_gguf(tmp_path / "good.gguf", "gemma3", {**meta, "rope.freq_base_swa": 10000.0}),
                      config=config)
    assert good.verdict == "correct", good.document()["facts"]
    without = audit_file(write_gguf(tmp_path / "without.gguf", "gemma3", meta), config=config)
    assert mistakes(without) == set() and without.found.theta_swa == 10000.0


def test_no_matching_preset_audits_internal_consistency(tmp_path: Path) -> None:
    meta = llama_gguf_meta(4096, 10000.0, hidden=1000, heads=10, kv=10, rot=100)
    result = audit_file(write_gguf(tmp_path / "own.gguf", "llama", meta))
    assert result.reference.kind == "none" and result.verdict == "consistent"
    factors = {"rope_freqs.weight": llama3_rope_factors(10000.0, 100, 8.0, 1.0, 4.0, 1024)}
    scaled = audit_file(write_gguf(tmp_path / "scaled.gguf", "llama", meta, factors))
    assert scaled.verdict == "consistent", scaled.document()["facts"]  # a scaled file is no mistake on its own
    short = {"rope_freqs.weight": factors["rope_freqs.weight"][:10]}
    assert mistakes(audit_file(write_gguf(tmp_path / "short.gguf", "llama", meta, short))) == \
        {"frequency_factors_wrong"}


def test_a_multi_gigabyte_sparse_file_in_well_under_a_second(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "big.gguf", "llama", llama_gguf_meta(131072, 500000.0), LLAMA31_FREQS,
                      sparse_bytes=16 << 30)
    assert path.stat().st_size > 16 << 30 and path.stat().st_blocks * 512 < 1 << 20  # a hole, nothing on disk
    tracemalloc.start()
    before = bytes_read()
    result = audit_file(path)
    read = bytes_read() - before
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert result.verdict == "consistent" and result.divergence is not None  # against the preset guessed by shape
    # the header and the position tensors only (the file is 16 GiB), held at once within 32 MiB
    assert read < 4 << 20 and peak < 32 << 20, (read, peak)
