"""Three latent-attention architectures of issue 61 the converter matrix found the audit wrong on
(tests/converters/more_architectures.py: their GGUFs as the pinned converter writes them), reproduced with hand-built
files:

- DeepSeek-V4: llama.cpp gives the layers with a KV compressor a RoPE of their own (attention.compress_rope_freq_base,
  the file's YaRN at attention factor 1) and the others rope.freq_base unscaled. Before: the correct GGUF was WRONG
  against its config.json (wrong_freq_base on the compressed layers, scaling_not_in_model on the main ones);
- the published config.json of Dots3-Note and DeepSeek-V4 (the hub's spelling, which their transformers config
  classes rewrite: swa_rope_theta and swa_* sizes; compress_ratios, qk_rope_head_dim, rope_scaling). Before: read as
  one RoPE over the whole head, so the correct Dots3 GGUF was WRONG against its own hub config.json
  (partial_rotary_dim_wrong, wrong_freq_base), and with the released sizes its sliding layers' KV latent
  (swa_kv_lora_rank 1024) was head_dim_wrong;
- Mistral-Small-4 (`mistral4`, DeepSeek-V2's loader and graph): llama.cpp reads rope.scaling.yarn_log_multiplier as
  0.1 x mscale_all_dim and cancels ggml's YaRN factor. Before: a note that the loader does not read it, and tables
  wrong by 0.1 ln 128 from position 0 (no mistake named).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from posenc.models.rope_config import rope_layer_types, rope_parameters_from_config
from tests.audit.conftest import audit_file, mistakes
from tests.audit_files import write_gguf

# DeepSeek-V4's config.json as the hub holds it (its position and attention keys), two layers: one sliding-window
# layer without a compressor, one compressed
DEEPSEEK_V4_HUB: dict[str, Any] = {
    "model_type": "deepseek_v4", "architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 4096,
    "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "max_position_embeddings": 1048576, "num_hidden_layers": 2, "compress_ratios": [0, 4], "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32,
                     "beta_slow": 1}}
# ... as transformers 5 saves it (DeepseekV4Config.to_dict)
DEEPSEEK_V4_SAVED: dict[str, Any] = {
    **{key: value for key, value in DEEPSEEK_V4_HUB.items() if key not in ("compress_ratios", "rope_scaling")},
    "layer_types": ["sliding_attention", "compressed_sparse_attention"], "partial_rotary_factor": 0.125,
    "rope_parameters": {
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
        "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.125, "factor": 16.0,
                     "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1,
                     "attention_factor": 1.0}}}


def deepseek4_meta(**changed: Any) -> dict[str, Any]:
    """DEEPSEEK_V4_HUB as the pinned convert_hf_to_gguf.py writes it (conversion/deepseek.py,
    DeepseekV4Model.set_gguf_parameters and TextModel's rope keys)."""
    meta = {"context_length": 1048576, "embedding_length": 4096, "block_count": 2, "attention.head_count": 64,
            "attention.head_count_kv": 1, "attention.key_length": 512, "rope.dimension_count": 64,
            "rope.freq_base": 10000.0, "rope.scaling.type": "yarn", "rope.scaling.factor": 16.0,
            "rope.scaling.original_context_length": 65536, "rope.scaling.yarn_beta_fast": 32.0,
            "rope.scaling.yarn_beta_slow": 1.0, "attention.compress_ratios": [0, 4],
            "attention.compress_rope_freq_base": 160000.0}
    meta.update(changed)
    return {key: value for key, value in meta.items() if value is not None}


@pytest.mark.parametrize("config", [DEEPSEEK_V4_SAVED, DEEPSEEK_V4_HUB], ids=["saved", "hub"])
def test_a_deepseek_v4_gguf_runs_two_ropes(tmp_path: Path, config: dict[str, Any]) -> None:
    result = audit_file(write_gguf(tmp_path / "v4.gguf", "deepseek4", deepseek4_meta()), config=config)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    document = result.document()
    assert {section["layer_type"]: section["verdict"] for section in document["layer_types"]} == {
        "compress": "correct", "main": "correct"}
    assert any("compress_rope_freq_base" in note for note in document["notes"])


@pytest.mark.parametrize(("changed", "named"), [
    ({"attention.compress_rope_freq_base": 10000.0}, {"wrong_freq_base"}),
    ({"rope.freq_base": 160000.0}, {"wrong_freq_base"}),
    ({"rope.scaling.type": None, "rope.scaling.factor": None}, {"scaling_missing"}),
    ({"rope.scaling.factor": 40.0}, {"scaling_factor_wrong"}),
])
def test_mistakes_in_a_deepseek_v4_gguf_are_named(tmp_path: Path, changed: dict[str, Any], named: set[str]) -> None:
    result = audit_file(write_gguf(tmp_path / "v4.gguf", "deepseek4", deepseek4_meta(**changed)),
                        config=DEEPSEEK_V4_HUB)
    assert result.verdict == "wrong" and named <= mistakes(result), mistakes(result)


# Dots3-Note's config.json as the hub holds it: two layers, DSA then sliding-window
DOTS3_HUB: dict[str, Any] = {
    "model_type": "dots3_note", "architectures": ["Dots3NoteForCausalLM"], "hidden_size": 5120,
    "num_attention_heads": 128, "num_key_value_heads": 128, "head_dim": 256, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "kv_lora_rank": 512, "v_head_dim": 128, "max_position_embeddings": 524288,
    "num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"], "use_dsa": True,
    "rope_theta": 80000000.0, "swa_rope_theta": 50000.0, "swa_num_attention_heads": 64, "swa_head_dim": 256,
    "swa_qk_nope_head_dim": 192, "swa_qk_rope_head_dim": 64, "swa_kv_lora_rank": 1024, "sliding_window_size": 512}


def dots3_meta(**changed: Any) -> dict[str, Any]:
    """DOTS3_HUB as the pinned converter writes it (conversion/dots3.py, Dots3NoteModel over DeepseekV2Model: MLA's
    compressed layout, freq_base_swa from swa_rope_theta)."""
    meta = {"context_length": 524288, "embedding_length": 5120, "block_count": 2,
            "attention.head_count": [128, 64], "attention.head_count_kv": 1, "attention.kv_lora_rank": 512,
            "attention.key_length": 576, "attention.key_length_mla": 192, "attention.key_length_swa": 1088,
            "attention.key_length_mla_swa": 256, "rope.dimension_count": 64, "rope.freq_base": 80000000.0,
            "rope.freq_base_swa": 50000.0, "attention.sliding_window": 512}
    meta.update(changed)
    return {key: value for key, value in meta.items() if value is not None}


def test_the_hub_spelling_of_dots3_reads_as_transformers_reads_it() -> None:
    assert rope_layer_types(DOTS3_HUB) == ("indexed_attention", "sliding_attention")
    dsa, _ = rope_parameters_from_config(DOTS3_HUB, layer_type="indexed_attention")
    sliding, _ = rope_parameters_from_config(DOTS3_HUB, layer_type="sliding_attention")
    assert (dsa.rope_theta, dsa.rotary_dim, sliding.rope_theta, sliding.rotary_dim) == (8e7, 64, 5e4, 64)


def test_the_hub_spelling_of_deepseek_v4_reads_as_transformers_reads_it() -> None:
    assert rope_layer_types(DEEPSEEK_V4_HUB) == ("compress", "main")
    for layer_type in ("compress", "main"):
        hub, _ = rope_parameters_from_config(DEEPSEEK_V4_HUB, layer_type=layer_type)
        saved, _ = rope_parameters_from_config(DEEPSEEK_V4_SAVED, layer_type=layer_type)
        assert hub == saved, layer_type
    compressed, _ = rope_parameters_from_config(DEEPSEEK_V4_HUB, layer_type="compress")
    assert (compressed.rope_type, compressed.rotary_dim, compressed.attention_factor) == ("yarn", 64, 1.0)


def test_a_dots3_gguf_against_its_hub_config(tmp_path: Path) -> None:
    result = audit_file(write_gguf(tmp_path / "dots3.gguf", "dots3note", dots3_meta()), config=DOTS3_HUB)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    wrong = audit_file(write_gguf(tmp_path / "swa.gguf", "dots3note", dots3_meta(**{"rope.freq_base_swa": 8e7})),
                       config=DOTS3_HUB)
    assert mistakes(wrong) == {"wrong_freq_base"}


def test_a_hub_config_of_bad_values_is_refused() -> None:
    from posenc.models.errors import ParameterError

    for key, value in (("compress_ratios", [0, 3]), ("compress_rope_theta", "x")):
        config = copy.deepcopy(DEEPSEEK_V4_HUB)
        config[key] = value
        with pytest.raises(ParameterError, match=key):
            rope_parameters_from_config(config, layer_type="compress")


# Mistral-Small-4's text model (Mistral3ForConditionalGeneration's text_config) and its GGUF as the converter writes it
# (conversion/mistral3.py, Mistral4Model over DeepseekV2Model)
MISTRAL4: dict[str, Any] = {
    "model_type": "mistral3", "architectures": ["Mistral3ForConditionalGeneration"], "text_config": {
        "model_type": "mistral4", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
        "head_dim": 128, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "kv_lora_rank": 256, "v_head_dim": 128,
        "max_position_embeddings": 1048576,
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                            "original_max_position_embeddings": 8192, "beta_fast": 32.0, "beta_slow": 1.0,
                            "mscale": 1.0, "mscale_all_dim": 1.0, "partial_rotary_factor": 0.5}}}


def mistral4_meta(**changed: Any) -> dict[str, Any]:
    meta = {"context_length": 1048576, "embedding_length": 4096, "block_count": 36, "attention.head_count": 32,
            "attention.head_count_kv": 1, "attention.kv_lora_rank": 256, "attention.key_length": 320,
            "attention.key_length_mla": 128, "rope.dimension_count": 64, "rope.freq_base": 10000.0,
            "rope.scaling.type": "yarn", "rope.scaling.factor": 128.0, "rope.scaling.original_context_length": 8192,
            "rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
            "rope.scaling.yarn_log_multiplier": 0.1}
    meta.update(changed)
    return {key: value for key, value in meta.items() if value is not None}


def test_a_mistral_small_4_gguf_carries_the_models_yarn_factor(tmp_path: Path) -> None:
    result = audit_file(write_gguf(tmp_path / "m4.gguf", "mistral4", mistral4_meta()), config=MISTRAL4)
    assert result.verdict == "correct", [f.explanation for f in result.failing]
    assert result.divergence is not None and result.divergence.max_abs < 1e-6


@pytest.mark.parametrize(("changed", "named"), [
    ({"rope.scaling.yarn_log_multiplier": 0.0707}, {"attention_factor_wrong"}),
    ({"rope.scaling.yarn_log_multiplier": None}, {"attention_factor_missing"}),
    ({"rope.dimension_count": 128}, {"partial_rotary_dim_wrong"}),
])
def test_mistakes_in_a_mistral_small_4_gguf_are_named(tmp_path: Path, changed: dict[str, Any], named: set[str]
                                                      ) -> None:
    result = audit_file(write_gguf(tmp_path / "m4.gguf", "mistral4", mistral4_meta(**changed)), config=MISTRAL4)
    assert result.verdict == "wrong" and named <= mistakes(result), mistakes(result)


@pytest.mark.parametrize(("changed", "key"), [
    ({"compress_ratios": [0, {"x": 1}]}, "compress_ratios"), ({"qk_rope_head_dim": "64"}, "qk_rope_head_dim"),
    ({"compress_ratios": None, "num_hidden_layers": 10**9}, "num_hidden_layers"),
])
def test_hostile_hub_spellings_are_a_clear_error(changed: dict[str, Any], key: str) -> None:
    from posenc.models.errors import ParameterError

    config = {**copy.deepcopy(DOTS3_HUB if key == "num_hidden_layers" else DEEPSEEK_V4_HUB), **changed}
    if key == "num_hidden_layers":
        config.pop("layer_types")
    with pytest.raises(ParameterError, match=key):
        rope_parameters_from_config(config, layer_type="sliding_attention" if key == "num_hidden_layers" else "main")
