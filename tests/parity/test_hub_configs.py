"""The hub's spelling of a config.json (`posenc.models.hub_configs`) read as the family's transformers config class
reads it: the published config.json of each family with one, given to its config class, whose `to_dict()` (what the
rotary sweep checks posenc against the modules with) reads to the same RoPE per layer type and the same attention
sizes as the published config.json itself."""

from __future__ import annotations

from typing import Any

import pytest
import transformers

from posenc.models.audit.reference import model_sizes
from posenc.models.rope_config import rope_layer_types, rope_parameters_from_config
from tests.audit.test_converter_findings_mla import DEEPSEEK_V4_HUB, DOTS3_HUB
from tests.audit.test_converter_findings_registered import MIMO_HUB, MODERNBERT_HUB

PUBLISHED = {"dots3_note": ("Dots3NoteConfig", DOTS3_HUB), "deepseek_v4": ("DeepseekV4Config", DEEPSEEK_V4_HUB),
             "modernbert": ("ModernBertConfig", MODERNBERT_HUB), "mimo_v2_flash": ("MiMoV2FlashConfig", MIMO_HUB)}


@pytest.mark.parametrize("family", sorted(PUBLISHED))
def test_the_published_config_reads_as_its_config_class_reads_it(family: str) -> None:
    class_name, published = PUBLISHED[family]
    kwargs = {key: value for key, value in published.items() if key not in ("model_type", "architectures")}
    saved: dict[str, Any] = getattr(transformers, class_name)(**kwargs).to_dict()
    names = rope_layer_types(saved)
    assert names and rope_layer_types(published) == names
    for name in names:
        ours, info = rope_parameters_from_config(published, layer_type=name)
        theirs, their_info = rope_parameters_from_config(saved, layer_type=name)
        assert ours == theirs, name
        assert info["layout"] == their_info["layout"]
        assert model_sizes(published, name) == model_sizes(saved, name), name
