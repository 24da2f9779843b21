"""Vision towers from real config.json files and request inputs beyond the config (issue 63): learned CLS angles
given as `class_pos_emb` (MLCD, LLaVA-OneVision-1.5), DeepSeek-OCR-2's 1-D sequence table, the hub files' own
spellings of the vision config's model_type and rope_type, and the catalogue's vision tower presets against them
(every tower against transformers: tests/parity/test_vision_sweep.py)."""

import json
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load as load_safetensors

from posenc.models.errors import ParameterError
from posenc.models.presets import catalogue
from posenc.models.presets.tables import preset_values
from posenc.models.vision_towers import check_cls_angles, find_tower, tower_cos_sin, tower_from_config

MLCD = {"model_type": "mlcd_vision_model", "hidden_size": 1664, "num_attention_heads": 16}  # head 104: 52 angles
LLAVA_OV = {"model_type": "llava_onevision1_5", "vision_config": {"model_type": "llava_onevision1_5_vision",
                                                                   "hidden_size": 1024, "num_heads": 16}}
OCR2 = {"model_type": "deepseek_ocr2", "vision_config": {"model_type": "deepseek_ocr2_vision", "encoder_config": {
    "model_type": "deepseek_ocr2_encoder", "hidden_size": 896, "num_attention_heads": 14}}}


def post(client: Any, url: str, body: Any) -> Any:
    return client.post(url, content=json.dumps(body), headers={"content-type": "application/json"})


def answer(response: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    assert response.status_code == 200, response.text
    length = int.from_bytes(response.content[:8], "little")
    return load_safetensors(response.content), json.loads(response.content[8:8 + length])["__metadata__"]


def test_learned_cls_rows_without_and_with_the_weight(client: Any) -> None:
    angles = np.random.default_rng(0).normal(size=52).round(6).tolist()
    patches, info = answer(post(client, "/v1/rope/from-config?grid_thw=1,3,4", MLCD))
    assert patches["cos"].shape == (12, 104)
    assert "class_pos_emb" in info["missing_rows"] and "52" in info["missing_rows"]
    raw = post(client, "/v1/rope/from-config?grid_thw=1,3,4&format=npy&tensor=cos", MLCD)
    assert raw.status_code == 200 and "class_pos_emb" in raw.headers["Posenc-Missing-Rows"]  # npy: no metadata
    full, info = answer(post(client, "/v1/rope/from-config?grid_thw=1,3,4", {**MLCD, "class_pos_emb": [angles]}))
    assert full["cos"].shape == (13, 104) and "missing_rows" not in info
    cls = np.concatenate([angles, angles])
    np.testing.assert_array_equal(full["cos"][0], np.cos(cls).astype(np.float32))
    np.testing.assert_array_equal(full["sin"][0], np.sin(cls).astype(np.float32))
    np.testing.assert_array_equal(full["cos"][1:], patches["cos"])
    # LLaVA-OneVision-1.5: one CLS row first in each frame, the vector given flat
    video, _ = answer(post(client, "/v1/rope/from-config?tower=vision&grid_thw=3,2,2",
                           {**LLAVA_OV, "class_pos_emb": angles[:32]}))
    assert video["cos"].shape == (15, 64)
    for row in (0, 5, 10):
        np.testing.assert_array_equal(video["cos"][row], np.cos(np.concatenate([angles[:32]] * 2)).astype(np.float32))


@pytest.mark.parametrize(("body", "value"), [
    (MLCD, [0.5] * 51),  # one short
    (MLCD, [[0.5] * 52, [0.5] * 52]),  # two rows
    (MLCD, ["0.5"] * 52),
    (MLCD, [True] * 52),
    (MLCD, "0.5"),
    ({"model_type": "gemma4_vision"}, [0.5] * 32),  # no learned CLS angles
])
def test_class_pos_emb_is_checked(client: Any, body: dict[str, Any], value: Any) -> None:
    r = post(client, "/v1/rope/from-config?grid_thw=1,2,2", {**body, "class_pos_emb": value})
    assert r.status_code == 422 and "class_pos_emb" in r.json()["error"], r.text


def test_class_pos_emb_must_be_finite() -> None:
    tower = tower_from_config(MLCD, True)
    assert tower is not None
    with pytest.raises(ParameterError, match="finite"):
        check_cls_angles(tower, [float("inf")] + [0.0] * 51)


@pytest.mark.parametrize("grid", [(1, 4, 6), (3, 2, 2)])
def test_learned_cls_row_blocks(grid: tuple[int, int, int]) -> None:
    """Row blocks of a table with learned CLS rows are those rows of the whole table, bit for bit."""
    tower = tower_from_config(LLAVA_OV, True)
    assert tower is not None
    tower = replace(tower, cls_angles=tuple(np.linspace(-3, 3, 32)))
    cos, sin, _ = tower_cos_sin(tower, grid)
    for start, stop in ((0, 1), (4, 11), (cos.shape[0] - 3, cos.shape[0])):
        part_cos, part_sin, _ = tower_cos_sin(tower, grid, rows=slice(start, stop))
        np.testing.assert_array_equal(part_cos, cos[start:stop])
        np.testing.assert_array_equal(part_sin, sin[start:stop])


@pytest.mark.parametrize(("grid", "rows"), [((1, 12, 12), 288), ((1, 13, 13), 425), ((1, 16, 16), 512)])
def test_deepseek_ocr2_is_its_encoders_1d_table(client: Any, grid: tuple[int, int, int], rows: int) -> None:
    """The feature tokens then 144 queries (tokens <= 144) or 256, positions 0 .. rows - 1: the text table of the
    encoder config's RoPE over as many positions, bit for bit."""
    tables, info = answer(post(client, f"/v1/rope/from-config?tower=vision&grid_thw={','.join(map(str, grid))}",
                               OCR2))
    assert tables["cos"].shape == (rows, 64) and info["config_section"] == "vision_config.encoder_config"
    text, _ = answer(post(client, f"/v1/rope/from-config?config_section=vision_config.encoder_config"
                                  f"&max_position={rows}", OCR2))
    np.testing.assert_array_equal(tables["cos"], text["cos"])
    np.testing.assert_array_equal(tables["sin"], text["sin"])
    assert post(client, "/v1/rope/from-config?tower=vision&grid_thw=2,4,4", OCR2).status_code == 422


# The vision config as each preset's hub config.json spells it (model_type, rope_parameters), read from published
# copies of those files: the whole config's model_type, the vision_config's.
HUB_SPELLINGS = {
    "qwen2.5-vl-7b-instruct": ("qwen2_5_vl", "qwen2_5_vl"),
    "qwen3-vl-8b-instruct": ("qwen3_vl", "qwen3_vl"),
    "glm-4.1v-9b-thinking": ("glm4v", "glm4v"),
    "paddleocr-vl": ("paddleocr_vl", "paddleocr_vl"),
    "gemma-4-31b-it": ("gemma4", "gemma4_vision"),
}


def test_every_tower_preset_has_its_hub_spelling() -> None:
    assert set(HUB_SPELLINGS) == {name for name, p in catalogue().items() if "vision_tower" in p.tables}


@pytest.mark.parametrize("name", sorted(HUB_SPELLINGS))
def test_find_tower_reads_the_hub_spelling(client: Any, name: str) -> None:
    preset = catalogue()[name]
    whole, vision = HUB_SPELLINGS[name]
    config = {**preset.config, "model_type": whole,
              "vision_config": {**preset.config["vision_config"], "model_type": vision}}
    found = find_tower(config, True)
    values = preset_values(preset, "vision_tower")
    assert found is not None and found[0].name == values["vision_tower"] and found[2] == "vision_config"
    grid = "1,4,4"
    ours, _ = answer(client.get(f"/v1/rope/vision/tower?preset={name}&grid_thw={grid}"))
    theirs, _ = answer(post(client, f"/v1/rope/from-config?tower=vision&grid_thw={grid}", config))
    assert ours["cos"].tobytes() == theirs["cos"].tobytes()


def test_a_foreign_vision_config_is_not_read_as_the_wrappers() -> None:
    """A vision config spelled neither as a known tower nor as its whole config is not guessed at."""
    assert find_tower({"model_type": "qwen3_vl", "vision_config": {"model_type": "siglip_vision_model"}}, True) is None


def test_rope_type_default_reads_as_the_config_class_default() -> None:
    """Hub files write rope_type "default" where the vision config class's default is axial (Gemma 4): transformers
    standardizes it to axial; a type the module refuses is still refused."""
    gemma = {"model_type": "gemma4_vision", "rope_parameters": {"rope_theta": 100.0, "rope_type": "default"}}
    tower = tower_from_config(gemma, True)
    assert tower is not None and tower.rope_theta == 100.0
    with pytest.raises(ParameterError, match="rope_type"):
        tower_from_config({**gemma, "rope_parameters": {"rope_type": "yarn"}}, True)
