"""Every preset's tables against transformers 5.23 built from the same config dict: its config class, then its
rotary embedding (RoPE), its bias function (ALiBi, T5, DeBERTa), its position table (sinusoidal, XLNet, Pixtral);
random draws of presets compare posenc's parsing of a config with transformers'; POST /v1/rope/from-config with a
preset's config equals ?preset=.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from transformers import CONFIG_MAPPING, PixtralVisionConfig
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions
from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding
from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
from transformers.models.t5.modeling_t5 import T5Attention
from transformers.models.whisper.modeling_whisper import sinusoids

from posenc.models.presets import Preset, catalogue
from posenc.models.presets.tables import preset_values
from posenc.models.rope_config import rope_parameters_from_config
from posenc.models.xlnet import xlnet_relative_sinusoid
from posenc.service.http.app import create_app
from posenc.service.settings import Settings
from tests.parity.test_rope_api import assert_matches_forward, tensors_and_metadata
from tests.parity.test_vision_rope import pixtral_reference
from tests.parity.test_xlnet import assert_matches as assert_xlnet_matches
from tests.rope_reference import cos_sin_tolerance

ROWS = 48  # rows of each compared table, at the start and at the end of the context

# model_type → (transformers package, config class, rotary embedding class)
ROTARY: dict[str, tuple[str, str, str]] = {
    "llama": ("llama", "LlamaConfig", "LlamaRotaryEmbedding"),
    "mistral": ("mistral", "MistralConfig", "MistralRotaryEmbedding"),
    "mixtral": ("mixtral", "MixtralConfig", "MixtralRotaryEmbedding"),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2RotaryEmbedding"),
    "qwen3": ("qwen3", "Qwen3Config", "Qwen3RotaryEmbedding"),
    "gemma": ("gemma", "GemmaConfig", "GemmaRotaryEmbedding"),
    "gemma2": ("gemma2", "Gemma2Config", "Gemma2RotaryEmbedding"),
    "gemma3_text": ("gemma3", "Gemma3TextConfig", "Gemma3RotaryEmbedding"),
    "gemma4_text": ("gemma4", "Gemma4TextConfig", "Gemma4TextRotaryEmbedding"),
    "phi3": ("phi3", "Phi3Config", "Phi3RotaryEmbedding"),
    "deepseek_v2": ("deepseek_v3", "DeepseekV3Config", "DeepseekV3RotaryEmbedding"),
    "deepseek_v3": ("deepseek_v3", "DeepseekV3Config", "DeepseekV3RotaryEmbedding"),
    "gpt_oss": ("gpt_oss", "GptOssConfig", "GptOssRotaryEmbedding"),
    "gpt_neox": ("gpt_neox", "GPTNeoXConfig", "GPTNeoXRotaryEmbedding"),
    "falcon": ("falcon", "FalconConfig", "FalconRotaryEmbedding"),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", "HunYuanDenseV1Config", "HunYuanDenseV1RotaryEmbedding"),
    # InternLM2 (remote code, no transformers class): a Llama with its rope_scaling, as its modeling file is
    "internlm2": ("llama", "LlamaConfig", "LlamaRotaryEmbedding"),
    "qwen2_vl": ("qwen2_vl", "Qwen2VLTextConfig", "Qwen2VLRotaryEmbedding"),
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLTextConfig", "Qwen2_5_VLRotaryEmbedding"),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLTextConfig", "Qwen3VLTextRotaryEmbedding"),
}
PRESETS = list(catalogue().values())
ROPE = [p.name for p in PRESETS if p.family in ("rope", "multimodal_rope") and p.config["model_type"] != "gptj"]


@pytest.fixture(scope="module")
def client() -> Any:
    with TestClient(create_app(Settings())) as test_client:
        yield test_client


def text_config(preset: Preset) -> dict[str, Any]:
    config = dict(preset.config.get("text_config") or preset.config)
    config.pop("vision_config", None)
    return {k: v for k, v in config.items() if k != "model_type"}


def hf_config(preset: Preset) -> Any:
    package, config_class, _ = ROTARY[preset.config["model_type"]]
    module = importlib.import_module(f"transformers.models.{package}.configuration_{package}")
    return getattr(module, config_class)(**text_config(preset))


def hf_rotary(preset: Preset) -> torch.nn.Module:
    package, _, rotary_class = ROTARY[preset.config["model_type"]]
    module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    return getattr(module, rotary_class)(hf_config(preset))


class TextPositions(torch.nn.Module):
    """An M-RoPE module fed text positions (t = h = w), as its model does for text tokens."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.inv_freq, self.attention_scaling = inner, inner.inv_freq, inner.attention_scaling

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inner(x, position_ids[None].expand(3, -1, -1))  # [3, batch, S]


class HalfForm(torch.nn.Module):
    """A rotary module that returns one column per frequency (gpt-oss), widened to the rotate_half form."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.inv_freq, self.attention_scaling = inner, inner.inv_freq, inner.attention_scaling

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.inner(x, position_ids)
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


@pytest.mark.parametrize("where", ["start", "end"])
@pytest.mark.parametrize("name", ROPE)
def test_rope_presets_equal_the_models_rotary_embedding(client: TestClient, name: str, where: str) -> None:
    preset = catalogue()[name]
    context = preset_values(preset, "rope")["max_position"]
    offset = 0 if where == "start" else context - ROWS
    response = client.get(f"/v1/rope?preset={name}&max_position={ROWS}&offset={offset}")
    assert response.status_code == 200, response.text
    tensors, _ = tensors_and_metadata(response.content)
    module = hf_rotary(preset)
    module = TextPositions(module) if preset.family == "multimodal_rope" else module
    module = HalfForm(module) if preset.config["model_type"] == "gpt_oss" else module
    layer_type = preset.serving.get("layer_type") if preset.config["model_type"] == "gemma4_text" else None
    if preset.config["model_type"] == "gemma3_text":
        layer_type = "full_attention"
    assert_matches_forward(tensors, module, offset, layer_type)


def test_gptj_preset_equals_create_sinusoidal_positions(client: TestClient) -> None:
    config = catalogue()["gpt-j-6b"].config
    tensors, _ = tensors_and_metadata(client.get("/v1/rope?preset=gpt-j-6b").content)
    sincos = create_sinusoidal_positions(config["n_positions"], config["rotary_dim"]).numpy()  # [pos, sin | cos]
    sin_ref, cos_ref = np.split(sincos, 2, axis=1)
    positions = np.arange(config["n_positions"])
    tol = np.repeat(cos_sin_tolerance(positions, tensors["inv_freq"], 1.0), 2, axis=1)
    assert np.all(np.abs(tensors["cos"] - np.repeat(cos_ref, 2, axis=1)) <= tol)  # interleaved: rotate_every_two
    assert np.all(np.abs(tensors["sin"] - np.repeat(sin_ref, 2, axis=1)) <= tol)


@pytest.mark.parametrize("seed", range(6))
def test_random_presets_parse_as_transformers_parses_them(seed: int) -> None:
    for name in random.Random(seed).sample(ROPE, 6):
        preset = catalogue()[name]
        ours, _ = rope_parameters_from_config(preset.config, layer_type=preset.serving.get("layer_type"))
        theirs = hf_config(preset)
        rope = theirs.rope_parameters
        if "full_attention" in rope:
            rope = rope[preset.serving.get("layer_type") or "full_attention"]
        assert ours.rope_theta == float(rope["rope_theta"]), name
        theirs_type = {"mrope": "default"}.get(rope["rope_type"], rope["rope_type"])
        if theirs_type == "dynamic" and rope.get("alpha"):  # as HunYuanDenseV1RotaryEmbedding reads it
            theirs_type = "ntk_alpha"
            assert ours.alpha == rope["alpha"], name
        assert ours.rope_type == theirs_type, name
        for key in ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor", "beta_fast",
                    "beta_slow", "mscale", "mscale_all_dim"):
            if getattr(ours, key) is not None and rope.get(key) is not None:
                assert getattr(ours, key) == rope[key], (name, key)
        assert ours.partial_rotary_factor == rope.get("partial_rotary_factor", 1.0), name


@pytest.mark.parametrize("name", [p.name for p in PRESETS if p.family in ("rope", "multimodal_rope")])
def test_from_config_with_the_presets_config_equals_the_preset(client: TestClient, name: str) -> None:
    preset = catalogue()[name]
    layer, layout = preset.serving.get("layer_type"), preset.serving.get("layout", "half")
    posted = client.post(f"/v1/rope/from-config?max_position={ROWS}&layout={layout}"
                         + (f"&layer_type={layer}" if layer else ""), json=dict(preset.config))
    got = client.get(f"/v1/rope?preset={name}&max_position={ROWS}&layout={layout}")
    assert posted.status_code == got.status_code == 200, posted.text
    from_config, _ = tensors_and_metadata(posted.content)
    from_preset, _ = tensors_and_metadata(got.content)
    for tensor in ("cos", "sin", "inv_freq"):
        assert np.array_equal(from_config[tensor], from_preset[tensor]), tensor


def fetch(client: TestClient, url: str) -> dict[str, np.ndarray]:
    response = client.get(url)
    assert response.status_code == 200, response.text
    return tensors_and_metadata(response.content)[0]


@pytest.mark.parametrize("name", [p.name for p in PRESETS if p.family == "alibi"])
def test_alibi_presets_equal_the_models_bias(client: TestClient, name: str) -> None:
    preset, q = catalogue()[name], 24
    bias = fetch(client, f"/v1/alibi/bias?preset={name}&query_length={q}&key_length={q}")["bias"]
    values = preset_values(preset, "alibi")
    if values["mode"] == "mpt":
        cfg = CONFIG_MAPPING["mpt"](n_heads=preset.config["n_heads"], attn_config=dict(preset.config["attn_config"]))
        ref = build_mpt_alibi_tensor(cfg.n_heads, q, cfg.attn_config.alibi_bias_max).numpy()  # [H, 1, q]
    else:  # BLOOM's build_alibi_tensor (Baichuan-13B builds the same +m·j bias in its own code)
        heads = values["num_heads"]
        ref = build_alibi_tensor(torch.ones(1, q), heads, torch.float32).reshape(heads, 1, q).numpy()
    # the references' float32 slopes times positions: equal within one float32 rounding
    np.testing.assert_allclose(bias, np.broadcast_to(ref, bias.shape), rtol=3e-7, atol=0)


@pytest.mark.parametrize("name", [p.name for p in PRESETS if p.family == "t5"])
def test_t5_presets_equal_the_bucket_function(client: TestClient, name: str) -> None:
    config = CONFIG_MAPPING[catalogue()[name].config["model_type"]](**text_config(catalogue()[name]))
    buckets = fetch(client, f"/v1/t5/buckets?preset={name}&query_length=40&key_length=300")["buckets"]
    relative = torch.arange(300)[None, :] - torch.arange(40)[:, None]  # key − query
    ref = T5Attention._relative_position_bucket(relative, bidirectional=True,
                                                num_buckets=config.relative_attention_num_buckets,
                                                max_distance=config.relative_attention_max_distance)
    np.testing.assert_array_equal(buckets, ref.numpy())


@pytest.mark.parametrize("name", [p.name for p in PRESETS if p.family == "deberta"])
def test_deberta_presets_equal_build_relative_position(client: TestClient, name: str) -> None:
    config = CONFIG_MAPPING["deberta-v2"](**text_config(catalogue()[name]))
    max_relative = config.max_relative_positions
    max_relative = max_relative if max_relative >= 1 else config.max_position_embeddings
    table = fetch(client, f"/v1/deberta/buckets?preset={name}&query_length=600&key_length=600")["relative_positions"]
    ref = build_relative_position(torch.zeros(1, 600, 1), torch.zeros(1, 600, 1), bucket_size=config.position_buckets,
                                  max_position=max_relative)
    np.testing.assert_array_equal(table, ref[0].numpy())


@pytest.mark.parametrize("name", [p.name for p in PRESETS if p.family == "xlnet"])
def test_xlnet_presets_equal_relative_positional_encoding(client: TestClient, name: str) -> None:
    c = catalogue()[name].config
    table = fetch(client, f"/v1/relative/sinusoidal?preset={name}&qlen=16&klen=32")["pos_emb"]
    args = (16, 32, c["d_model"], c["attn_type"], c["bi_data"], c["clamp_len"])
    np.testing.assert_array_equal(table, xlnet_relative_sinusoid(*args))  # the preset's parameters, as served
    assert_xlnet_matches(*args)  # and XLNet's own table within the RoPE bound of each row's distance


@pytest.mark.parametrize("name", [p.name for p in PRESETS if p.family == "sinusoidal"])
def test_sinusoidal_presets_equal_the_models_table(client: TestClient, name: str) -> None:
    preset = catalogue()[name]
    c, variant = preset.config, preset.serving["variant"]
    table = fetch(client, f"/v1/sinusoidal?preset={name}")["pe"]
    if variant == "tensor2tensor":
        ref = sinusoids(c["max_source_positions"], c["d_model"]).numpy()
    elif variant == "marian":
        ref = MarianSinusoidalPositionalEmbedding(c["max_position_embeddings"], c["d_model"]).create_weight().numpy()
    else:
        ref = M2M100SinusoidalPositionalEmbedding.get_embedding(c["max_position_embeddings"], c["d_model"],
                                                                c["pad_token_id"]).numpy()
    np.testing.assert_allclose(table, ref, rtol=0, atol=5e-4)


@pytest.mark.parametrize("name", [p.name for p in PRESETS if p.family == "vision_rope"])
def test_vision_presets_equal_the_vision_rotary_embedding(client: TestClient, name: str) -> None:
    vision = dict(catalogue()[name].config["vision_config"])
    vision.pop("model_type")
    tensors = fetch(client, f"/v1/rope/vision?preset={name}&height=8&width=8")
    cos, sin = pixtral_reference(PixtralVisionConfig(**vision), 8, 8)
    np.testing.assert_allclose(tensors["cos"], cos, rtol=0, atol=1e-5)
    np.testing.assert_allclose(tensors["sin"], sin, rtol=0, atol=1e-5)
