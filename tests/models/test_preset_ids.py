"""A public model id names one preset: the first of the catalogue that carries it, when several do (a model's
plain entry before its long-context one, e.g. Qwen/Qwen3-8B and qwen3-8b-yarn)."""

from __future__ import annotations

from collections import defaultdict

from posenc.models.presets import catalogue, find_preset


def _presets_by_id() -> dict[str, list[str]]:
    """Lower-cased model id → the names of its presets, in catalogue order."""
    out: dict[str, list[str]] = defaultdict(list)
    for preset in catalogue().values():
        out[preset.model_id.lower()].append(preset.name)
    return out


def test_qwen3_8b_names_its_plain_preset_not_the_yarn_one() -> None:
    assert _presets_by_id()["qwen/qwen3-8b"] == ["qwen3-8b", "qwen3-8b-yarn"]
    for spelling in ("Qwen/Qwen3-8B", "qwen/qwen3-8b", "QWEN/QWEN3-8B"):
        assert find_preset(spelling).name == "qwen3-8b"
    assert find_preset("qwen3-8b-yarn").name == "qwen3-8b-yarn"  # the slug still reaches the other


def test_every_model_id_names_the_first_preset_that_carries_it() -> None:
    shared = {model_id: names for model_id, names in _presets_by_id().items() if len(names) > 1}
    assert shared  # the rule has something to hold for
    for model_id, names in _presets_by_id().items():
        assert find_preset(model_id).name == names[0], (model_id, names)
