"""Vision RoPE parity: Pixtral (`PixtralVisionRotaryEmbedding` on `PixtralVisionModel`'s positions) and Llama 4
(`Llama4VisionRotaryEmbedding.freqs_ci`, applied by `vision_apply_rotary_emb`) within the precision contract,
for grids up to the models' maxima; GET /v1/rope/vision and from-config on vision configs; the vision towers'
route (`?tower=vision&grid_thw=`): its rules, forms, dtypes and row blocks (every tower against transformers:
tests/parity/test_vision_sweep.py).
"""

import json
import random
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import load as load_safetensors
from transformers.models.llama4.configuration_llama4 import Llama4VisionConfig
from transformers.models.llama4.modeling_llama4 import Llama4VisionRotaryEmbedding, vision_apply_rotary_emb
from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig
from transformers.models.pixtral.modeling_pixtral import PixtralVisionRotaryEmbedding

from posenc.models.errors import ParameterError
from posenc.models.presets import catalogue
from posenc.models.presets.tables import preset_values
from posenc.models.vision_rope import vision_cos_sin, vision_positions
from posenc.models.vision_towers import TOWERS_BY_NAME, tower_cos_sin, tower_from_config, window_order
from tests.parity import vision_sweep
from tests.rope_reference import cos_sin_tolerance


def pixtral_reference(config: PixtralVisionConfig, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    h, w = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    positions = torch.stack([h.flatten(), w.flatten()], dim=-1)  # as PixtralVisionModel.forward
    cos, sin = PixtralVisionRotaryEmbedding(config)(torch.zeros(1), positions)
    return cos.numpy(), sin.numpy()


def bound(model: Any, height: int, width: int, freqs: np.ndarray, columns: int) -> np.ndarray:
    """Precision contract per element, from the larger of the two positions of each patch."""
    positions = vision_positions(model, height, width).max(axis=1)
    per_freq = cos_sin_tolerance(positions, freqs, 1.0)  # [rows, head_dim/2]
    return np.tile(per_freq, 2) if columns == 2 * freqs.size else per_freq


@pytest.mark.parametrize(("hidden", "heads", "theta"), [(1024, 16, 10000.0), (1024, 8, 10000.0), (512, 16, 1e6)])
@pytest.mark.parametrize("seed", range(4))
def test_pixtral_matches_reference(hidden: int, heads: int, theta: float, seed: int) -> None:
    config = PixtralVisionConfig(hidden_size=hidden, num_attention_heads=heads, image_size=1024, patch_size=16,
                                 rope_parameters={"rope_type": "axial", "rope_theta": theta})
    rng = random.Random(seed)
    height, width = (64, 64) if seed == 0 else (rng.randint(1, 64), rng.randint(1, 64))
    ref_cos, ref_sin = pixtral_reference(config, height, width)
    cos, sin, freqs = vision_cos_sin("pixtral", config.head_dim, theta, height, width)
    assert cos.shape == ref_cos.shape == (height * width, config.head_dim)
    tol = bound("pixtral", height, width, freqs, config.head_dim)
    assert np.all(np.abs(cos - ref_cos) <= tol) and np.all(np.abs(sin - ref_sin) <= tol)
    half_cos, _, _ = vision_cos_sin("pixtral", config.head_dim, theta, height, width, form="half")
    np.testing.assert_array_equal(half_cos, cos[:, : config.head_dim // 2])


@pytest.mark.parametrize(("hidden", "heads", "image", "patch"), [
    (1408, 16, 336, 14), (768, 16, 448, 14), (1024, 16, 560, 14), (512, 8, 64, 16),
])
def test_llama4_matches_reference(hidden: int, heads: int, image: int, patch: int) -> None:
    config = Llama4VisionConfig(hidden_size=hidden, num_attention_heads=heads, image_size=image, patch_size=patch)
    rope: Any = config.rope_parameters
    theta = float(rope["rope_theta"])
    head_dim, side = hidden // heads, image // patch
    freqs_ci = Llama4VisionRotaryEmbedding(config).freqs_ci[:, 0]  # [side² + 1, head_dim/2] complex
    cos, sin, freqs = vision_cos_sin("llama4", head_dim, theta, side, side, form="half")
    tol = bound("llama4", side, side, freqs, head_dim // 2)
    assert cos.shape == tuple(freqs_ci.shape)
    assert np.all(np.abs(cos - freqs_ci.real.numpy()) <= tol) and np.all(np.abs(sin - freqs_ci.imag.numpy()) <= tol)
    assert cos[-1].tolist() == [1.0] * (head_dim // 2) and not sin[-1].any()  # CLS row: zero angles

    # form=full is the interleaved layout: rotating channel pairs with it equals vision_apply_rotary_emb
    full_cos, full_sin, _ = vision_cos_sin("llama4", head_dim, theta, side, side)
    query = torch.randn(1, side * side + 1, 2, head_dim, generator=torch.Generator().manual_seed(0))
    ref, _ = vision_apply_rotary_emb(query, query, Llama4VisionRotaryEmbedding(config).freqs_ci)
    q = query.numpy().astype(np.float64)
    rotated = q.copy()
    rotated[..., 0::2], rotated[..., 1::2] = -q[..., 1::2], q[..., 0::2]  # (x0, x1) → (−x1, x0) per pair
    ours = q * full_cos[None, :, None, :] + rotated * full_sin[None, :, None, :]
    # each output is x1·cos ∓ x2·sin of its pair: the table's bound weighted by |x1| + |x2|, plus the
    # reference's float32 products and sum (an ulp of each term)
    weight = np.repeat(np.abs(q[..., 0::2]) + np.abs(q[..., 1::2]), 2, axis=-1)  # [1, rows, 2, head_dim]
    per_channel = np.repeat(bound("llama4", side, side, freqs, head_dim // 2), 2, axis=-1)  # [rows, head_dim]
    eps = float(np.finfo(np.float32).eps)
    assert np.all(np.abs(ours - ref.numpy()) <= weight * (per_channel[None, :, None, :] + 2 * eps))


def test_llama4_grid_is_square() -> None:
    with pytest.raises(ParameterError) as info:
        vision_positions("llama4", 3, 4)
    assert info.value.parameter == "width"


# --- HTTP ------------------------------------------------------------------------------------------


def metadata(body: bytes) -> dict[str, str]:
    header: dict[str, dict[str, str]] = json.loads(body[8:8 + int.from_bytes(body[:8], "little")])
    return header["__metadata__"]


def test_vision_route(client: Any) -> None:
    r = client.get("/v1/rope/vision?model=pixtral&head_dim=64&height=5&width=9")
    assert r.status_code == 200, r.text
    tensors = load_safetensors(r.content)
    np.testing.assert_array_equal(tensors["cos"], vision_cos_sin("pixtral", 64, 10000.0, 5, 9)[0])
    assert metadata(r.content)["layout"] == "half"
    llama = client.get("/v1/rope/vision?model=llama4&head_dim=88&image_size=336&patch_size=14")
    assert llama.status_code == 200 and load_safetensors(llama.content)["cos"].shape == (577, 88)
    assert metadata(llama.content)["layout"] == "interleaved"


@pytest.mark.parametrize(("query", "field"), [
    ("model=pixtral&head_dim=64&height=65", "height"),
    ("model=pixtral&head_dim=62", "head_dim"),
    ("model=pixtral&head_dim=64&width=0", "width"),
    ("model=llama4&head_dim=64&height=3", "height"),
    ("model=pixtral&head_dim=64&patch_size=2048", "patch_size"),
])
def test_vision_bad_input(client: Any, query: str, field: str) -> None:
    r = client.get(f"/v1/rope/vision?{query}")
    assert r.status_code == 422, r.text
    assert field in r.json()["error"]


PIXTRAL = {"model_type": "pixtral", "hidden_size": 1024, "num_attention_heads": 16, "image_size": 1024,
           "patch_size": 16, "rope_theta": 10000.0, "head_dim": 64}


def post(client: Any, path: str, body: Any) -> Any:
    return client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})


def test_from_config_pixtral(client: Any) -> None:
    r = post(client, "/v1/rope/from-config", PIXTRAL)
    assert r.status_code == 200, r.text
    tensors = load_safetensors(r.content)
    config = PixtralVisionConfig(hidden_size=1024, num_attention_heads=16, image_size=1024, patch_size=16)
    ref_cos, ref_sin = pixtral_reference(config, 64, 64)
    tol = bound("pixtral", 64, 64, tensors["inv_freq"], 64)
    assert np.all(np.abs(tensors["cos"] - ref_cos) <= tol) and np.all(np.abs(tensors["sin"] - ref_sin) <= tol)
    assert metadata(r.content)["tower"] == "vision"

    wrapper = {"model_type": "llava", "vision_config": PIXTRAL, "text_config": {
        "model_type": "mistral", "head_dim": 128, "hidden_size": 5120, "num_attention_heads": 32,
        "rope_theta": 1e9, "max_position_embeddings": 4096}}
    vision = post(client, "/v1/rope/from-config?tower=vision", wrapper)
    assert vision.status_code == 200 and vision.content == r.content
    text = post(client, "/v1/rope/from-config?max_position=8", wrapper)
    assert text.status_code == 200 and load_safetensors(text.content)["cos"].shape == (8, 128)
    assert post(client, "/v1/rope/from-config?max_position=8", PIXTRAL).status_code == 422
    assert post(client, "/v1/rope/from-config?tower=vision", wrapper["text_config"]).status_code == 422


# --- vision towers: POST /v1/rope/from-config?tower=vision&grid_thw=t,h,w (the sweep compares every tower with
# transformers: tests/parity/test_vision_sweep.py; here the route's rules and the table's own invariants) -----------

QWEN25_VL = {"model_type": "qwen2_5_vl", "vision_config": {"model_type": "qwen2_5_vl_vision", "hidden_size": 1280,
                                                           "num_heads": 16, "window_size": 112, "patch_size": 14,
                                                           "spatial_merge_size": 2}}
LLAVA_OV = {"model_type": "llava_onevision1_5_vision", "hidden_size": 1024, "num_heads": 16}
INKLING2 = {"model_type": "inkling2_vision", "hidden_size": 1024, "num_attention_heads": 16}
MINIMAX = {"model_type": "minimax_m3_vl_vision", "hidden_size": 1280, "num_attention_heads": 16}
GEMMA4 = {"model_type": "gemma4_vision", "head_dim": 64, "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}}


def test_tower_answer(client: Any) -> None:
    r = post(client, "/v1/rope/from-config?tower=vision&grid_thw=2,10,18", QWEN25_VL)
    assert r.status_code == 200, r.text
    tensors, info = load_safetensors(r.content), metadata(r.content)
    assert tensors["cos"].shape == (360, 80) and tensors["inv_freq"].shape == (40,)
    assert info["vision_tower"] == "qwen2_5_vl" and info["layout"] == "half" and info["window"] == "4"
    assert info["config_section"] == "vision_config" and info["grid_thw"] == "2,10,18"
    bare = post(client, "/v1/rope/from-config?grid_thw=2,10,18", QWEN25_VL["vision_config"])  # tower implied
    assert bare.status_code == 200 and load_safetensors(bare.content)["cos"].tobytes() == tensors["cos"].tobytes()
    # MiniMax-M3-VL: t, h, w bands of 13 frequencies each, 78 of 80 channels rotated
    minimax = post(client, "/v1/rope/from-config?grid_thw=2,2,2", MINIMAX)
    assert load_safetensors(minimax.content)["cos"].shape == (8, 78)


@pytest.mark.parametrize(("body", "query", "field"), [
    (QWEN25_VL, "tower=vision&grid_thw=1,3,4", "grid_thw"),  # not a multiple of the merge
    (QWEN25_VL, "tower=vision", "grid_thw"),  # no grid
    (QWEN25_VL, "tower=vision&grid_thw=1,4,4&merge_size=2", "merge_size"),  # merge is the config's
    (QWEN25_VL, "tower=vision&grid_thw=1,4,4&max_position=8", "max_position"),
    (QWEN25_VL, "tower=vision&grid_thw=1,4,4&layout=interleaved", "layout"),
    (QWEN25_VL, "tower=text&grid_thw=1,4,4", "grid_thw"),
    (QWEN25_VL, "tower=vision&grid_thw=1,4", "grid_thw"),
    (GEMMA4, "grid_thw=2,4,4", "grid_thw"),  # images only
    ({**PIXTRAL}, "grid_thw=1,65,2", "grid_thw"),  # beyond image_size // patch_size
    ({"model_type": "llama4_vision_model"}, "grid_thw=1,31,32", "grid_thw"),  # a fixed grid
    ({**QWEN25_VL["vision_config"], "rope_parameters": {"rope_type": "yarn"}}, "grid_thw=1,4,4", "rope_type"),
    ({**QWEN25_VL["vision_config"], "num_heads": 1000}, "grid_thw=1,4,4", "head_dim"),
    ({"model_type": "qwen2_vl", "text_config": {}}, "tower=vision&grid_thw=1,4,4", "tower"),
])
def test_tower_bad_input(client: Any, body: dict[str, Any], query: str, field: str) -> None:
    r = post(client, f"/v1/rope/from-config?{query}", body)
    assert r.status_code == 422, r.text
    assert field in r.json()["error"]


def test_tower_cls_rows(client: Any) -> None:
    # inkling2: one zero-angle CLS row first per image (frames included); LLaVA-OneVision-1.5: learned, left out
    inkling = load_safetensors(post(client, "/v1/rope/from-config?grid_thw=3,4,4", INKLING2).content)
    assert inkling["cos"].shape[0] == 49 and not inkling["sin"][0].any() and inkling["sin"][1:].all(axis=1).any()
    r = post(client, "/v1/rope/from-config?grid_thw=3,4,4", LLAVA_OV)
    assert load_safetensors(r.content)["cos"].shape[0] == 48 and "learned" in metadata(r.content)["cls_rows"]
    llama = load_safetensors(post(client, "/v1/rope/from-config?grid_thw=1,32,32",
                                  {"model_type": "llama4_vision_model"}).content)
    assert llama["cos"].shape == (1025, 48) and not llama["sin"][-1].any()


def test_tower_layouts_forms_and_dtypes(client: Any) -> None:
    """form=half is one column per angle; form=full its pair layout; float64 rounds once to the float32 answer."""
    for body, spread in ((QWEN25_VL, lambda a: np.concatenate([a, a], axis=1)),
                         (INKLING2, lambda a: np.repeat(a, 2, axis=1)),
                         (GEMMA4, lambda a: np.concatenate([a[:, :16], a[:, :16], a[:, 16:], a[:, 16:]], axis=1))):
        grid = "1,4,6"
        full = load_safetensors(post(client, f"/v1/rope/from-config?tower=vision&grid_thw={grid}", body).content)
        half = load_safetensors(post(client, f"/v1/rope/from-config?tower=vision&grid_thw={grid}&form=half",
                                     body).content)
        np.testing.assert_array_equal(spread(half["cos"]), full["cos"])
        wide = load_safetensors(post(client, f"/v1/rope/from-config?tower=vision&grid_thw={grid}&dtype=float64",
                                     body).content)
        assert wide["cos"].dtype == np.float64
        np.testing.assert_array_equal(wide["cos"].astype(np.float32), full["cos"])


@pytest.mark.parametrize(("body", "grid"), [(QWEN25_VL, (2, 10, 18)), (LLAVA_OV, (3, 4, 6)), (INKLING2, (2, 4, 4)),
                                            (MINIMAX, (3, 4, 4)), (GEMMA4, (1, 5, 7))])
def test_tower_row_blocks(body: dict[str, Any], grid: tuple[int, int, int]) -> None:
    """Any row range of a tower table is those rows of the whole table, bit for bit."""
    tower = tower_from_config(body, True)
    assert tower is not None
    cos, sin, _ = tower_cos_sin(tower, grid)
    for start, stop in ((0, 1), (3, 17), (cos.shape[0] - 5, cos.shape[0])):
        part_cos, part_sin, _ = tower_cos_sin(tower, grid, rows=slice(start, stop))
        np.testing.assert_array_equal(part_cos, cos[start:stop])
        np.testing.assert_array_equal(part_sin, sin[start:stop])


def test_window_order_is_the_references() -> None:
    """The window reordering, on a grid whose windows are partly filled, against transformers' own index."""
    from transformers.vision_utils import get_vision_window_index

    for t, h, w in ((1, 10, 18), (2, 8, 8), (1, 2, 34)):
        ours = window_order(t, h, w, 2, 4)
        theirs, _ = get_vision_window_index(torch.tensor([[t, h, w]]), 2, 112, 14)
        np.testing.assert_array_equal(ours, theirs.numpy())


# --- the catalogue's vision-language presets: GET /v1/rope/vision/tower?preset= against the tower module built from
# the preset's vision config (one layer) and against from-config of the preset's config ------------------------------

TOWER_PRESETS = [name for name, preset in catalogue().items() if "vision_tower" in preset.tables]


@pytest.mark.parametrize("name", TOWER_PRESETS)
def test_vision_tower_presets_equal_the_tower_module(client: Any, name: str) -> None:
    preset = catalogue()[name]
    values = preset_values(preset, "vision_tower")
    scheme = TOWERS_BY_NAME[values["vision_tower"]]
    rotary = next(r for r in vision_sweep.vision_classes() if r.name == scheme.module)
    config = vision_sweep.vision_config(rotary)  # the config class's defaults, one layer, then the preset's values
    config = type(config).from_dict({**config.to_dict(), **preset.config["vision_config"]})  # as transformers reads
    owner = vision_sweep.owner_class(rotary)(config).eval()
    merge = values["spatial_merge_size"]
    window = values["window"] * merge  # patches per window side
    grid = (1, window + merge, 2 * window + merge) if window else (1, 4 * merge, 6 * merge)  # crossing windows
    cos, sin = vision_sweep.tower_table(rotary, owner, config, scheme, grid, merge)
    r = client.get(f"/v1/rope/vision/tower?preset={name}&grid_thw={','.join(map(str, grid))}")
    assert r.status_code == 200, r.text
    tensors = load_safetensors(r.content)
    assert tensors["cos"].shape == cos.shape and tensors["cos"].shape[1] == values["head_dim"]
    tol = vision_sweep.rounding_bound(scheme, grid, tensors["inv_freq"], metadata(r.content)["layout"])
    assert np.all(np.abs(tensors["cos"] - cos) <= tol) and np.all(np.abs(tensors["sin"] - sin) <= tol)
    upload = post(client, f"/v1/rope/from-config?tower=vision&grid_thw={','.join(map(str, grid))}", dict(preset.config))
    assert upload.status_code == 200 and load_safetensors(upload.content)["cos"].tobytes() == tensors["cos"].tobytes()
