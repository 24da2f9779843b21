"""What issue 61 found the audit got wrong for model families whose files the converters write their own way, each
reproduced with a hand-built file of what the tool writes (tests/audit_files.py), and the references the audit
cannot apply:

- MLA (DeepSeek-V2/V3, MiniCPM3): llama.cpp's converter writes attention.key_length = qk_nope_head_dim +
  qk_rope_head_dim (MiniCPM3) or, for deepseek2, its compressed layout (key_length = kv_lora_rank + qk_rope_head_dim,
  key_length_mla = the q/k head, one KV head) and rope.scaling.yarn_log_multiplier = 0.1 x mscale_all_dim, from which
  llama.cpp computes the factor cos and sin carry. Before: head_count_wrong and head_dim_wrong, and tables wrong by
  0.1 ln 40 from position 0 (ggml's YaRN factor applied where llama.cpp cancels it): every such GGUF WRONG;
- InternLM3's dynamic scaling, which GGUF cannot state (the converter leaves it out): scaling_missing before;
- ERNIE-4.5's interleaved pairs under --config (the family table gives the layout);
- Llama 4's llama3 scaling with low_freq_factor = high_freq_factor = 1: config_not_buildable where transformers builds
  it, and with that --config the audit fell back to internal consistency and exited 0 on a GGUF with the scaling
  dropped. A reference the audit cannot apply is now an error (exit status 2, HTTP 422) that says so.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from posenc.models.audit.found import Found
from posenc.models.audit.reference import from_preset
from posenc.models.errors import ParameterError
from posenc.service.audit import extract
from posenc.service.cli.main import main
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import caches_of, genai_onnx, llama3_rope_factors, write_gguf

# DeepSeek-V2-Lite's config.json (its position and attention keys)
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "model_type": "deepseek_v2", "architectures": ["DeepseekV2ForCausalLM"], "hidden_size": 2048,
    "num_attention_heads": 16, "num_key_value_heads": 16, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "kv_lora_rank": 512, "v_head_dim": 128, "q_lora_rank": None, "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"}}


def deepseek2_meta(mscale_all_dim: float = 0.707, **changed: Any) -> dict[str, Any]:
    """DEEPSEEK_V2_LITE as the pinned convert_hf_to_gguf.py writes it (DeepseekV2Model.set_gguf_parameters: MLA as MQA
    of the latent, the yarn keys of TextModel.set_gguf_parameters, yarn_log_multiplier = 0.1 x mscale_all_dim)."""
    meta = {"context_length": 163840, "embedding_length": 2048, "block_count": 27, "attention.head_count": 16,
            "attention.head_count_kv": 1, "attention.kv_lora_rank": 512, "attention.key_length": 576,
            "attention.value_length": 512, "attention.key_length_mla": 192, "attention.value_length_mla": 128,
            "rope.dimension_count": 64, "rope.freq_base": 10000.0, "rope.scaling.type": "yarn",
            "rope.scaling.factor": 40.0, "rope.scaling.original_context_length": 4096,
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
            "rope.scaling.yarn_log_multiplier": 0.1 * mscale_all_dim}
    meta.update(changed)
    return {key: value for key, value in meta.items() if value is not None}


def _write(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(json.dumps(config))
    return path


def test_a_deepseek_v2_gguf_in_llama_cpps_mla_layout_is_correct(tmp_path: Path) -> None:
    """Before: WRONG, head_count_wrong (1 KV head), head_dim_wrong (576) and the tables 0.369 off from position 0."""
    path = write_gguf(tmp_path / "dsv2.gguf", "deepseek2", deepseek2_meta())
    config = _write(tmp_path / "config.json", DEEPSEEK_V2_LITE)
    for result in (audit_file(path, config=DEEPSEEK_V2_LITE), audit_file(path, preset="deepseek-v2-lite")):
        assert result.verdict == "correct" and not result.failing, result.document()["facts"]
        facts = {f.name: f for f in result.facts}
        assert (facts["key_length_mla"].expected, facts["head_dim"].expected, facts["num_kv_heads"].expected) \
            == (192, 576, 1)
        assert result.divergence is not None and result.divergence.max_abs == 0.0
        notes = "\n".join(result.found.notes)
        assert "deepseek2.attention.key_length_mla: llama.cpp takes the q/k head" in notes
        assert "llama.cpp reads mscale 0.707, mscale_all_dim 0.707" in notes
    assert main(["audit", str(path), "--config", str(config)]) == 0
    # the extract `posenc audit --remote` sends carries the MLA head
    assert extract.load(json.loads(json.dumps(extract.dump(audit_file(path).found)))).key_length_mla == 192


def test_deepseek_v3_and_the_layout_before_mla(tmp_path: Path) -> None:
    """DeepSeek-V3 (mscale = mscale_all_dim = 1: the converter writes 0.1) is correct; so is a GGUF of the converters
    before the compressed layout (key_length = nope + rope, the model's KV heads, no key_length_mla)."""
    v3 = from_preset("deepseek-v3")
    meta = deepseek2_meta(1.0, **{"embedding_length": 7168, "attention.head_count": 128, "block_count": 61})
    result = audit_file(write_gguf(tmp_path / "v3.gguf", "deepseek2", meta), preset="deepseek-v3")
    assert result.verdict == "correct", result.document()["facts"]
    assert v3.mla is not None and v3.mla.head == 192
    before = deepseek2_meta(**{"attention.head_count_kv": 16, "attention.key_length": 192,
                               "attention.key_length_mla": None, "attention.value_length_mla": None})
    result = audit_file(write_gguf(tmp_path / "before.gguf", "deepseek2", before), config=DEEPSEEK_V2_LITE)
    assert result.verdict == "correct", result.document()["facts"]
    assert {f.name: f.expected for f in result.facts}["head_dim"] == 192


@pytest.mark.parametrize(("changed", "named"), [
    ({"attention.key_length_mla": 128}, {"head_dim_wrong"}),  # the rope dims left out of the q/k head
    ({"attention.key_length": 512}, {"head_dim_wrong"}),  # the latent without the rotated part
    ({"attention.head_count_kv": 16}, {"head_count_wrong"}),  # the compressed layout with the model's KV heads
    ({"rope.dimension_count": 128}, {"partial_rotary_dim_wrong"}),
    ({"rope.scaling.yarn_log_multiplier": None}, {"attention_factor_missing"}),
    ({"rope.scaling.yarn_log_multiplier": 0.1}, {"attention_factor_wrong"}),
])
def test_mistakes_in_a_deepseek_v2_gguf_are_named(tmp_path: Path, changed: dict[str, Any], named: set[str]) -> None:
    path = write_gguf(tmp_path / "dsv2.gguf", "deepseek2", deepseek2_meta(**changed))
    result = audit_file(path, config=DEEPSEEK_V2_LITE)
    assert result.verdict == "wrong" and mistakes(result) == named, result.document()["facts"]


def test_without_the_yarn_multiplier_llama_cpps_tables_carry_ggmls_factor(tmp_path: Path) -> None:
    """No yarn_log_multiplier: llama.cpp's cos and sin carry 0.1 ln 40 + 1, the model's 1 (its mscale ratio)."""
    result = audit_file(write_gguf(tmp_path / "dsv2.gguf", "deepseek2",
                                   deepseek2_meta(**{"rope.scaling.yarn_log_multiplier": None})),
                        config=DEEPSEEK_V2_LITE)
    assert result.divergence is not None and result.divergence.first_position == 0
    assert result.divergence.max_abs == pytest.approx(0.1 * np.log(40), rel=1e-6)
    # an architecture whose loader does not read the multiplier: noted, not applied
    llama = write_gguf(tmp_path / "llama.gguf", "llama", {"rope.scaling.yarn_log_multiplier": 0.07, "rope.freq_base":
                                                          10000.0, "rope.dimension_count": 64})
    found = audit_file(llama).found
    assert "llama.rope.scaling.yarn_log_multiplier = 0.07: llama.cpp's llama loader does not read it" in found.notes
    assert "mscale_all_dim" not in found.scaling


def test_a_deepseek_gguf_is_matched_by_its_shape(tmp_path: Path) -> None:
    """Before: no preset fit (the file's head size 576 against the preset's 64): internal consistency only."""
    result = audit_file(write_gguf(tmp_path / "dsv2.gguf", "deepseek2", deepseek2_meta()))
    assert result.reference.guessed and result.reference.fits[0] == "deepseek-v2-lite", result.reference.document()
    assert result.verdict == "consistent" and not [f for f in result.facts if f.verdict == "note"]


# MiniCPM3-4B's config.json (longrope over its 32 rotated channels of each q/k head)
MINICPM3: dict[str, Any] = {
    "model_type": "minicpm3", "hidden_size": 2560, "num_attention_heads": 40, "num_key_value_heads": 40,
    "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "kv_lora_rank": 256, "q_lora_rank": 768,
    "max_position_embeddings": 32768, "rope_theta": 10000.0,
    "rope_scaling": {"type": "longrope", "long_factor": [1.0 + i / 8 for i in range(16)],
                     "short_factor": [1.0 + i / 16 for i in range(16)], "original_max_position_embeddings": 32768}}


def minicpm3_gguf(path: Path, key_length: int = 96) -> Path:
    """MINICPM3 as convert_hf_to_gguf.py's MiniCPM3Model writes it: key_length = nope + rope, no freq_base, the
    longrope factors as tensors."""
    meta = {"context_length": 32768, "embedding_length": 2560, "block_count": 2, "attention.head_count": 40,
            "attention.head_count_kv": 40, "attention.kv_lora_rank": 256, "attention.key_length": key_length,
            "rope.dimension_count": 32}
    scaling = MINICPM3["rope_scaling"]
    return write_gguf(path, "minicpm3", meta, {
        "rope_factors_long.weight": np.asarray(scaling["long_factor"], np.float32),
        "rope_factors_short.weight": np.asarray(scaling["short_factor"], np.float32)})


def test_a_minicpm3_gguf_states_the_qk_head(tmp_path: Path) -> None:
    """Before: WRONG head_dim_wrong (key_length 96 against the rotary head 32)."""
    result = audit_file(minicpm3_gguf(tmp_path / "minicpm3.gguf"), config=MINICPM3)
    assert result.verdict == "correct" and not result.failing, result.document()["facts"]
    assert {f.name: f.expected for f in result.facts}["head_dim"] == 96
    wrong = audit_file(minicpm3_gguf(tmp_path / "rope-only.gguf", key_length=32), config=MINICPM3)
    assert mistakes(wrong) == {"head_dim_wrong"}
    assert "qk_nope_head_dim + qk_rope_head_dim = 64 + 32 = 96" in next(
        f.explanation for f in wrong.failing if f.name == "head_dim")
    # its config.json against itself: the rotary head as transformers builds it
    assert audit_file(_write(tmp_path / "config.json", MINICPM3), config=MINICPM3).verdict == "correct"


# InternLM3-8B-Instruct's config.json: dynamic NTK, which GGUF has no key for
INTERNLM3: dict[str, Any] = {
    "model_type": "internlm3", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 2,
    "head_dim": 128, "max_position_embeddings": 32768, "rope_theta": 50000000,
    "rope_scaling": {"factor": 6.0, "rope_type": "dynamic"}}
INTERNLM3_GGUF = {"context_length": 32768, "embedding_length": 4096, "block_count": 2, "attention.head_count": 32,
                  "attention.head_count_kv": 2, "attention.key_length": 128, "rope.dimension_count": 128,
                  "rope.freq_base": 50000000.0}


def test_dynamic_scaling_gguf_cannot_state_is_unchecked_not_missing(tmp_path: Path) -> None:
    """Before: WRONG scaling_missing, exit 1 (the converter leaves dynamic scaling out on purpose)."""
    path = write_gguf(tmp_path / "internlm3.gguf", "llama", INTERNLM3_GGUF)
    result = audit_file(path, config=INTERNLM3)
    assert result.verdict == "correct" and not result.failing, result.document()["facts"]
    scaling = next(f for f in result.facts if f.name == "scaling.type")
    assert scaling.verdict == "unchecked" and "dynamic scaling is recomputed at run time" in scaling.explanation
    assert "llama.cpp has no RoPE scaling recomputed from the sequence length" in scaling.explanation
    assert main(["audit", str(path), "--config", str(_write(tmp_path / "config.json", INTERNLM3))]) == 0
    # the rest is still judged: another base is named
    other = write_gguf(tmp_path / "other.gguf", "llama", {**INTERNLM3_GGUF, "rope.freq_base": 10000.0})
    assert mistakes(audit_file(other, config=INTERNLM3)) == {"wrong_freq_base"}


ERNIE = {"model_type": "ernie4_5", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 2,
         "head_dim": 128, "max_position_embeddings": 2048, "rope_theta": 500000.0}


@pytest.mark.parametrize(("interleaved", "named"), [(1, set()), (0, {"interleaved_vs_half"})])
def test_ernie_onnx_pairs_judged_by_the_family_layout(tmp_path: Path, interleaved: int, named: set[str]) -> None:
    """ERNIE-4.5 rotates pairs (2i, 2i+1) (transformers' Ernie4_5): with its config.json alone (no preset) the layout
    comes from the table of architectures; before it, only presets carried one (interleaved_vs_half for the right
    file)."""
    cos, sin = caches_of(ERNIE, 2048)
    path = tmp_path / "model.onnx"
    path.write_bytes(genai_onnx(cos, sin, heads=16, kv_heads=2, interleaved=interleaved))
    result = audit_file(path, config=ERNIE)
    assert mistakes(result) == named and result.verdict == ("wrong" if named else "correct"), \
        result.document()["facts"]


# Llama-4-Scout's text config: llama3 scaling with low_freq_factor = high_freq_factor = 1
LLAMA4: dict[str, Any] = {
    "model_type": "llama4_text", "hidden_size": 5120, "num_attention_heads": 40, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 262144, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
LLAMA4_GGUF = {"context_length": 262144, "embedding_length": 5120, "block_count": 2, "attention.head_count": 40,
               "attention.head_count_kv": 8, "attention.key_length": 128, "rope.dimension_count": 128,
               "rope.freq_base": 500000.0}


def test_llama4_scaling_builds_and_a_gguf_without_it_is_wrong(tmp_path: Path) -> None:
    """Before: its config.json was config_not_buildable, and against it a GGUF with the scaling dropped was
    CONSISTENT, exit 0."""
    config = _write(tmp_path / "config.json", LLAMA4)
    assert audit_file(config, config=LLAMA4).verdict == "correct"
    factors = llama3_rope_factors(500000.0, 128, 16.0, 1.0, 1.0, 8192)
    good = write_gguf(tmp_path / "good.gguf", "llama4", LLAMA4_GGUF, {"rope_freqs.weight": factors})
    assert audit_file(good, config=LLAMA4).verdict == "correct"
    dropped = write_gguf(tmp_path / "dropped.gguf", "llama4", LLAMA4_GGUF)
    result = audit_file(dropped, config=LLAMA4)
    assert mistakes(result) == {"frequency_factors_missing"}, result.document()["facts"]
    assert main(["audit", str(dropped), "--config", str(config)]) == 1


def _broken_configs() -> list[tuple[dict[str, Any], str]]:
    theta = copy.deepcopy(LLAMA4)
    theta["rope_theta"] = "x"
    layered = {"model_type": "gemma3_text", "hidden_size": 512, "num_attention_heads": 4, "head_dim": 128,
               "max_position_embeddings": 8192, "layer_types": ["sliding_attention", "full_attention"],
               "rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    return [(theta, "rope_theta: must be a finite number"),
            (layered, "(layer type full_attention): factor: missing in rope_parameters")]


@pytest.mark.parametrize(("config", "why"), _broken_configs())
def test_a_reference_the_audit_cannot_apply_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         client: TestClient, config: dict[str, Any],
                                                         why: str) -> None:
    """Before: the file was audited for internal consistency behind the named reference, CONSISTENT, exit 0."""
    dropped = write_gguf(tmp_path / "dropped.gguf", "llama4", LLAMA4_GGUF)
    path = _write(tmp_path / "config.json", config)
    assert main(["audit", str(dropped), "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("posenc audit: config: the given config.json cannot be the audit's reference") \
        and why in err, err
    response = client.post("/v1/audit", params={"config": json.dumps(config)}, content=dropped.read_bytes())
    assert response.status_code == 422 and why in response.json()["error"], response.text[:300]
    with pytest.raises(ParameterError):
        audit_file(dropped, config=config)


def test_a_preset_without_a_position_handling_the_audit_judges_is_an_error(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str],
                                                                           client: TestClient) -> None:
    """Whisper's sinusoidal table: no RoPE, ALiBi or learned table to judge a file by. Before: CONSISTENT, exit 0."""
    dropped = write_gguf(tmp_path / "dropped.gguf", "llama4", LLAMA4_GGUF)
    assert main(["audit", str(dropped), "--preset", "whisper-tiny"]) == 2
    assert capsys.readouterr().err.startswith("posenc audit: preset: preset whisper-tiny (openai/whisper-tiny) "
                                              "cannot be the audit's reference")
    response = client.post("/v1/audit", params={"preset": "whisper-tiny"}, content=dropped.read_bytes())
    assert response.status_code == 422, response.text[:300]
    # the references that judge without RoPE still apply: ALiBi presets, learned positions
    assert audit_file(dropped, preset="bloom-560m").reference.alibi_mode == "bloom"


def test_a_config_json_audited_states_its_kv_heads(tmp_path: Path) -> None:
    """config_reader reads the sizes through the table of architectures, as the reference does: the KV heads too."""
    fewer = {**INTERNLM3, "num_key_value_heads": 4}
    result = audit_file(_write(tmp_path / "config.json", fewer), config=INTERNLM3)
    assert isinstance(result.found, Found) and result.found.num_kv_heads == 4
    assert mistakes(result) == {"head_count_wrong"}
