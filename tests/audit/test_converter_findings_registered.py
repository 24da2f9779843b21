"""What converting the converter's further registered architectures found the audit got wrong (issue 61: the rows of
tests/converters/registered_architectures.py), each reproduced with a hand-built GGUF of what the pinned converter
wrote and the config.json it was made from:

- BitNet (and CodeShell): the converter writes rope.scaling.type `linear` with factor 1 for every model, which llama.cpp
  runs unscaled; the audit called it `scaling_not_in_model`;
- nomic-bert's published config.json (nomic-ai's remote code: n_embd, n_head, rotary_emb_base) gave no head size, and
  the audit fell back to a learned position table (n_positions): any GGUF, a wrong base too, was CORRECT, exit 0;
- ModernBERT's (global_rope_theta, local_rope_theta, global_attn_every_n_layers) and MiMo-V2-Flash's published
  config.json (hybrid_layer_pattern, swa_rope_theta) were read as one RoPE: a GGUF with its sliding layers' base wrong
  passed;
- Step-3.5/3.7 (`step35`): llama.cpp's loader halves the full layers' rotated channels after the sliding layers took
  theirs; the audit read the whole head for both (partial_rotary_dim_wrong on a correct file);
- MiMo-V2-Flash, ModernBERT, PLaMo-3, Step-3.5 and Dots3-Note: their loaders read rope.freq_base_swa over llama.cpp's
  default 10000 (not freq_base), as the Gemma loaders do;
- Hunyuan-A13B (`hunyuan-moe`): the converter writes a 262144-token context on purpose, as for the dense model;
- GLM-5-Next's text model has no RoPE: its config read as a RoPE over hidden // heads and audited "correct";
- HunyuanOCR (`hunyuan_vl`): its config's four XD-RoPE sections were refused ("three positive integers"), and
  llama.cpp's loader stretches the written base by rope.scaling.alpha, which the audit did not;
- onnxruntime-genai writes Qwen2.5-VL's and Qwen3-VL's M-RoPE as MRotaryEmbedding nodes (on q and on k): the ONNX
  reader saw no RoPE in the graph (`partial_rotary_dim_wrong`, `mrope_sections_wrong`); Step-3.7's published
  config.json (per-layer rope_theta and partial_rotary_factors lists) was refused;
- Granite's `rope.scaling.finetuned` is llama.cpp's switch of RoPE on every layer, and GraniteMoeHybrid's
  `position_embedding_type` the model's: neither was read (a hybrid written without RoPE against a RoPE model, or
  with RoPE against a NoPE model, audited correct).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from posenc.models.errors import ParameterError
from posenc.models.rope_config import rope_parameters_from_config
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import write_gguf


def _audited(tmp_path: Path, arch: str, meta: dict[str, Any], config: dict[str, Any]) -> Any:
    return audit_file(write_gguf(tmp_path / f"{arch}.gguf", arch, meta), config=config)


BITNET = {"model_type": "bitnet", "architectures": ["BitNetForCausalLM"], "hidden_size": 2560,
          "num_attention_heads": 20, "num_key_value_heads": 5, "max_position_embeddings": 4096,
          "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}
BITNET_GGUF = {"context_length": 4096, "embedding_length": 2560, "attention.head_count": 20,
               "attention.head_count_kv": 5, "rope.freq_base": 500000.0, "rope.scaling.type": "linear",
               "rope.scaling.factor": 1.0, "block_count": 30}


def test_linear_scaling_by_one_is_no_scaling(tmp_path: Path) -> None:
    result = _audited(tmp_path, "bitnet", BITNET_GGUF, BITNET)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    scaled = _audited(tmp_path, "bitnet", {**BITNET_GGUF, "rope.scaling.factor": 4.0}, BITNET)
    assert "scaling_not_in_model" in mistakes(scaled)


# nomic-embed-text-v1.5's config.json as the hub holds it
NOMIC_HUB = {"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "n_embd": 768, "n_head": 12,
             "n_layer": 12, "n_positions": 8192, "max_trained_positions": 2048, "rotary_emb_base": 1000,
             "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False}
NOMIC_GGUF = {"context_length": 2048, "embedding_length": 768, "attention.head_count": 12, "rope.freq_base": 1000.0,
              "block_count": 12}


def test_a_nomic_bert_hub_config_is_a_rope_reference(tmp_path: Path) -> None:
    assert _audited(tmp_path, "nomic-bert", NOMIC_GGUF, NOMIC_HUB).verdict == "correct"
    wrong = _audited(tmp_path, "nomic-bert", {**NOMIC_GGUF, "rope.freq_base": 10000.0}, NOMIC_HUB)
    assert mistakes(wrong) == {"wrong_freq_base"}


MODERNBERT_HUB = {"model_type": "modernbert", "architectures": ["ModernBertModel"], "hidden_size": 768,
                  "num_attention_heads": 12, "num_hidden_layers": 22, "max_position_embeddings": 8192,
                  "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "global_attn_every_n_layers": 3}
MODERNBERT_GGUF = {"context_length": 8192, "embedding_length": 768, "attention.head_count": 12,
                   "rope.freq_base": 160000.0, "rope.freq_base_swa": 10000.0, "attention.sliding_window": 128,
                   "attention.sliding_window_pattern": 3, "block_count": 22}
MIMO_HUB = {"model_type": "mimo_v2_flash", "architectures": ["MiMoV2FlashForCausalLM"], "hidden_size": 4096,
            "num_attention_heads": 64, "num_key_value_heads": 4, "head_dim": 192, "max_position_embeddings": 262144,
            "num_hidden_layers": 4, "hybrid_layer_pattern": [0, 1, 1, 1], "rope_theta": 5000000.0,
            "swa_rope_theta": 10000.0, "partial_rotary_factor": 0.334}
MIMO_GGUF = {"context_length": 262144, "embedding_length": 4096, "attention.head_count": 64,
             "attention.head_count_kv": 4, "attention.key_length": 192, "rope.dimension_count": 64,
             "rope.freq_base": 5000000.0, "rope.freq_base_swa": 10000.0, "attention.sliding_window": 128,
             "block_count": 4}


@pytest.mark.parametrize(("arch", "meta", "config"), [("modern-bert", MODERNBERT_GGUF, MODERNBERT_HUB),
                                                      ("mimo2", MIMO_GGUF, MIMO_HUB)], ids=["modernbert", "mimo"])
def test_a_hub_config_with_a_sliding_base_judges_both_layer_types(tmp_path: Path, arch: str, meta: dict[str, Any],
                                                                   config: dict[str, Any]) -> None:
    result = _audited(tmp_path, arch, meta, config)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    assert {section["layer_type"] for section in result.document()["layer_types"]} == {"full_attention",
                                                                                        "sliding_attention"}
    wrong = _audited(tmp_path, arch, {**meta, "rope.freq_base_swa": meta["rope.freq_base"]}, config)
    assert mistakes(wrong) == {"wrong_freq_base"}
    # their loaders read freq_base_swa over llama.cpp's default 10000: without it the sliding layers still run 10000
    absent = {key: value for key, value in meta.items() if key != "rope.freq_base_swa"}
    assert _audited(tmp_path, arch, absent, config).verdict == "correct"


# Step-3.5's attention: full layers rotate half of each 128-channel head over base 5000000, sliding layers the whole
# head over base 10000 (transformers 5's form)
STEP35 = {"model_type": "step3p7", "architectures": ["Step3p7ForCausalLM"], "hidden_size": 4096,
          "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 262144,
          "layer_types": ["full_attention", "sliding_attention"], "sliding_window": 512,
          "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5000000.0,
                                                 "partial_rotary_factor": 0.5},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
STEP35_GGUF = {"context_length": 262144, "embedding_length": 4096, "attention.head_count": [64, 64],
               "attention.head_count_kv": [8, 8], "attention.key_length": 128, "rope.freq_base": 5000000.0,
               "rope.freq_base_swa": 10000.0, "attention.sliding_window": 512, "block_count": 2}


def test_step35_rotates_half_of_the_full_layers_head(tmp_path: Path) -> None:
    result = _audited(tmp_path, "step35", STEP35_GGUF, STEP35)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    assert any("n_rot_full / 2" in note for note in result.document()["notes"])
    wrong = _audited(tmp_path, "step35", {**STEP35_GGUF, "rope.dimension_count": 64}, STEP35)
    assert "partial_rotary_dim_wrong" in mistakes(wrong)


HUNYUAN_MOE = {"model_type": "hunyuan_v1_moe", "architectures": ["HunYuanMoEV1ForCausalLM"], "hidden_size": 4096,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 32768,
               "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0}}
HUNYUAN_MOE_GGUF = {"context_length": 262144, "embedding_length": 4096, "attention.head_count": 32,
                    "attention.head_count_kv": 8, "attention.key_length": 128,
                    "rope.freq_base": 10000.0 * 1000.0 ** (128 / 126), "rope.scaling.type": "none", "block_count": 32}


def test_the_hunyuan_moe_converters_context_is_a_note(tmp_path: Path) -> None:
    result = _audited(tmp_path, "hunyuan-moe", HUNYUAN_MOE_GGUF, HUNYUAN_MOE)
    assert result.verdict == "correct", [f.explanation for f in result.failing]


def test_glm5_next_has_no_rope_to_serve() -> None:
    config = {"model_type": "glm5_next", "text_config": {
        "model_type": "glm5_next_text", "hidden_size": 256, "num_attention_heads": 2, "qk_rope_head_dim": 0,
        "qk_nope_head_dim": 64, "kv_lora_rank": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}}
    with pytest.raises(ParameterError, match="no rotary positions"):
        rope_parameters_from_config(config)


# HunyuanOCR's text model: XD-RoPE's four sections, NTK-alpha 1000 over base 10000 (transformers 5's form), and its
# GGUF as the converter writes it: the base unstretched beside rope.scaling.alpha, which llama.cpp's loader applies
HUNYUAN_OCR = {"model_type": "hunyuan_vl", "architectures": ["HunYuanVLForConditionalGeneration"], "text_config": {
    "model_type": "hunyuan_vl_text", "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 32768,
    "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0,
                        "mrope_section": [16, 16, 16, 16]}}}
HUNYUAN_OCR_GGUF = {"context_length": 32768, "embedding_length": 1024, "attention.head_count": 16,
                    "attention.head_count_kv": 8, "attention.key_length": 128, "rope.freq_base": 10000.0,
                    "rope.scaling.alpha": 1000.0, "rope.dimension_sections": [16, 16, 16, 16], "block_count": 24}


def test_a_hunyuan_ocr_gguf_is_stretched_by_its_loader(tmp_path: Path) -> None:
    result = _audited(tmp_path, "hunyuan_vl", HUNYUAN_OCR_GGUF, HUNYUAN_OCR)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    assert mistakes(_audited(tmp_path, "hunyuan_vl", {**HUNYUAN_OCR_GGUF, "rope.scaling.alpha": 1.0},
                             HUNYUAN_OCR)) == {"wrong_freq_base"}
    sections = _audited(tmp_path, "hunyuan_vl", {**HUNYUAN_OCR_GGUF, "rope.dimension_sections": [32, 16, 8, 8]},
                        HUNYUAN_OCR)
    assert mistakes(sections) == {"mrope_sections_wrong"}
    with pytest.raises(ParameterError, match="four positive integers"):
        rope_parameters_from_config({**HUNYUAN_OCR, "text_config": {
            **HUNYUAN_OCR["text_config"], "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24]}}})


# Granite-4.0-H-Tiny's text model: Mamba-2 layers and attention layers without positions (NoPE), and its GGUF as the
# converter writes it (GraniteHybridModel: rope.scaling.finetuned false, llama.cpp's switch for RoPE on every layer)
GRANITE_H = {"model_type": "granitemoehybrid", "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 1536,
             "num_attention_heads": 12, "num_key_value_heads": 4, "max_position_embeddings": 131072,
             "position_embedding_type": "nope", "layer_types": ["mamba", "attention"],
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
GRANITE_H_GGUF = {"context_length": 1048576, "embedding_length": 1536, "attention.head_count": 12,
                  "attention.head_count_kv": [0, 4], "rope.freq_base": 10000.0, "rope.scaling.finetuned": False,
                  "block_count": 2}


@pytest.mark.parametrize(("position_embedding_type", "finetuned", "named"), [
    ("nope", False, set()), (None, False, set()),
    ("rope", False, {"rope_missing"}), ("nope", True, {"rope_not_in_model"}), ("rope", True, set())])
def test_llama_cpps_rope_switch_of_granite(tmp_path: Path, position_embedding_type: str | None, finetuned: bool,
                                           named: set[str]) -> None:
    config = {**GRANITE_H, "position_embedding_type": position_embedding_type}
    meta = {**GRANITE_H_GGUF, "rope.scaling.finetuned": finetuned, "context_length": 131072}
    result = _audited(tmp_path, "granitehybrid", meta, config)
    assert mistakes(result) == named, [f.explanation for f in result.failing]
    assert result.verdict == ("wrong" if named else "correct")


@pytest.mark.parametrize(("file_type", "reference_type", "named"), [
    ("nope", "nope", set()), ("rope", "rope", set()), ("rope", "nope", {"rope_not_in_model"}),
    ("nope", "rope", {"rope_missing"})])
def test_a_granite_hybrid_config_against_another(file_type: str, reference_type: str, named: set[str]) -> None:
    import json

    from posenc.service.audit import config_reader
    from posenc.service.audit.run import parse_config, run

    found = config_reader.document_found(json.dumps({**GRANITE_H, "position_embedding_type": file_type}).encode())
    result = run(found, None, parse_config(json.dumps({**GRANITE_H, "position_embedding_type": reference_type})))
    assert mistakes(result) == named



QWEN25_VL = {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"], "text_config": {
    "model_type": "qwen2_5_vl_text", "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
    "max_position_embeddings": 128000,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]}}}


def test_an_onnx_model_with_mrotary_embedding_nodes(tmp_path: Path) -> None:
    from tests.audit_files import caches_of, genai_onnx

    cos, sin = caches_of(QWEN25_VL, 128000)
    path = tmp_path / "model.onnx"
    path.write_bytes(genai_onnx(cos, sin, heads=28, kv_heads=4, mrope_section=(16, 24, 24)))
    result = audit_file(path, config=QWEN25_VL)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    path.write_bytes(genai_onnx(cos, sin, heads=28, kv_heads=4, mrope_section=(32, 16, 16)))
    assert mistakes(audit_file(path, config=QWEN25_VL)) == {"mrope_sections_wrong"}


# Step-3.7-Flash's text config as the hub holds it: one base and one partial rotary factor a layer
STEP37_HUB = {"model_type": "step3p7", "architectures": ["Step3p7ForConditionalGeneration"], "text_config": {
    "model_type": "step3p5", "hidden_size": 4096, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 262144, "layer_types": ["full_attention", "sliding_attention"],
    "rope_theta": [5000000.0, 10000.0], "partial_rotary_factors": [0.5, 1.0]}}


def test_step37s_published_config_reads_per_layer_type(tmp_path: Path) -> None:
    full, _ = rope_parameters_from_config(STEP37_HUB, layer_type="full_attention")
    sliding, _ = rope_parameters_from_config(STEP37_HUB, layer_type="sliding_attention")
    assert (full.rope_theta, full.rotary_dim, sliding.rope_theta, sliding.rotary_dim) == (5e6, 64, 1e4, 128)
    assert _audited(tmp_path, "step35", STEP35_GGUF, STEP37_HUB).verdict == "correct"


@pytest.mark.parametrize("alpha", [-4.0, 3e38])
def test_a_hostile_alpha_is_judged_not_a_crash(tmp_path: Path, alpha: float) -> None:
    result = _audited(tmp_path, "hunyuan_vl", {**HUNYUAN_OCR_GGUF, "rope.scaling.alpha": alpha}, HUNYUAN_OCR)
    assert result.verdict == "wrong"  # before: a complex power (TypeError) and an OverflowError, both a 500


def test_an_infinite_alpha_is_a_clear_error(tmp_path: Path) -> None:
    from posenc.service.errors import BadRequest

    with pytest.raises(BadRequest, match="alpha must be a finite number"):
        _audited(tmp_path, "hunyuan_vl", {**HUNYUAN_OCR_GGUF, "rope.scaling.alpha": float("inf")}, HUNYUAN_OCR)
