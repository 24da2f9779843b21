"""RoPE variants of inference engines against transformers' own modules: HunYuan's NTK-alpha."""

import json
from typing import Any

import numpy as np
from safetensors.numpy import load as load_safetensors


def test_hunyuan_config_matches_its_rotary_module(client: Any) -> None:
    """A HunYuan config labels NTK-alpha `dynamic` with an `alpha`; transformers' HunYuan module (and posenc)
    read it as ntk_alpha."""
    import torch
    from transformers.models.hunyuan_v1_dense.configuration_hunyuan_v1_dense import HunYuanDenseV1Config
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding

    from tests.rope_reference import assert_inv_freq_close, cos_sin_tolerance

    rope_scaling = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0}
    config = {"model_type": "hunyuan_v1_dense", "hidden_size": 512, "num_attention_heads": 4, "head_dim": 128,
              "max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": rope_scaling}
    r = client.post("/v1/rope/from-config?max_position=256", content=json.dumps(config),
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    tensors = load_safetensors(r.content)
    legacy: dict[str, Any] = {"rope_scaling": dict(rope_scaling), "rope_theta": 10000.0}  # v4 keys, as on the Hub
    rotary = HunYuanDenseV1RotaryEmbedding(HunYuanDenseV1Config(
        hidden_size=512, num_attention_heads=4, head_dim=128, max_position_embeddings=4096, **legacy))
    assert rotary.rope_type == "ntk_alpha"
    assert_inv_freq_close(tensors["inv_freq"], rotary.inv_freq.numpy())
    ref_cos, _ = rotary(torch.zeros(1), torch.arange(256)[None, :])
    bound = np.tile(cos_sin_tolerance(np.arange(256), tensors["inv_freq"], 1.0), 2)
    assert np.all(np.abs(tensors["cos"] - ref_cos[0].numpy()) <= bound)

