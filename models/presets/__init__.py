"""The bundled catalogue of public model configurations: each model's position facts, with where each was read.

A preset is one public model (its Hugging Face id) and the position-related part of its configuration, in the
spelling of its `config.json` (`config`), plus the facts its modeling code fixes and no config states
(`serving`: a rotary layout, the layer type whose table is meant, an ALiBi bias form...). `read_from` names
where each value was read (`SOURCES`). The data lives in this package's *.json files; `posenc.models.presets.tables`
turns a preset into the parameters of each table family it applies to, through the same resolvers as a
config.json upload (`posenc.models.rope_config`, `posenc.models.vision_rope`). docs/presets.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from posenc.models.errors import ParameterError

# where a value was read: the labels `read_from` may use
SOURCES: Mapping[str, str] = MappingProxyType({
    "config.json": "the model's config.json on its Hugging Face hub page",
    "model card": "the model card (README) on its hub page, e.g. a recommended rope_scaling block",
    "config class default": "the default of the model's transformers 5.23 config class (the file leaves it out)",
    "modeling code": "the model's transformers 5.23 modeling code (a fact no config states)",
    "vLLM": "vLLM's implementation of the model (its DeepSeek models use DeepseekScalingRotaryEmbedding)",
})

# family → the table kinds (`posenc.models.presets.tables.TABLE_KINDS`) a preset of it applies to; a
# multimodal preset whose serving names `"tower": "vision"` also serves its vision tower's table (`Preset.tables`)
FAMILY_TABLES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "rope": ("rope",), "multimodal_rope": ("rope", "multimodal_rope"), "vision_rope": ("vision_rope",),
    "vision_tower": ("vision_tower",),
    "alibi": ("alibi",), "t5": ("t5",), "deberta": ("deberta",), "xlnet": ("xlnet",), "sinusoidal": ("sinusoidal",),
})


@dataclass(frozen=True)
class Preset:
    """One public model's position facts. `name` is the stable lower-case slug; `model_id` the hub id."""

    name: str
    model_id: str
    family: str
    config: Mapping[str, Any]
    serving: Mapping[str, Any]
    read_from: Mapping[str, tuple[str, ...]]

    @property
    def tables(self) -> tuple[str, ...]:
        tables = FAMILY_TABLES[self.family]
        if self.family == "multimodal_rope" and self.serving.get("tower") == "vision":
            return (*tables, "vision_tower")
        return tables

    def source_of(self, key: str) -> str:
        """Where `key` (of config or serving) was read."""
        return next(label for label, keys in self.read_from.items() if key in keys)


def _preset(entry: Mapping[str, Any]) -> Preset:
    """One catalogue entry, checked: a known family, a lower-case slug, every value's source named once."""
    name, family = entry["name"], entry["family"]
    if name != name.lower() or not name or any(c.isspace() or c == "/" for c in name):
        raise ValueError(f"preset name {name!r}: a lower-case slug without spaces or slashes")
    if family not in FAMILY_TABLES:
        raise ValueError(f"preset {name}: unknown family {family!r}")
    read_from = {label: tuple(keys) for label, keys in entry["read_from"].items()}
    unknown = sorted(set(read_from) - set(SOURCES))
    if unknown:
        raise ValueError(f"preset {name}: unknown sources {unknown}")
    named = [key for keys in read_from.values() for key in keys]
    given = [*entry["config"], *entry.get("serving", {})]
    if sorted(named) != sorted(given):
        raise ValueError(f"preset {name}: read_from must name each config and serving key once "
                         f"(named {sorted(named)}, given {sorted(given)})")
    return Preset(name, entry["model_id"], family, MappingProxyType(dict(entry["config"])),
                  MappingProxyType(dict(entry.get("serving", {}))), MappingProxyType(read_from))


@cache
def catalogue() -> Mapping[str, Preset]:
    """Every preset by name, in file and entry order (the package's *.json files, read once)."""
    presets: dict[str, Preset] = {}
    for item in sorted(resources.files(__package__).iterdir(), key=lambda p: p.name):
        if item.name.endswith(".json"):
            for entry in json.loads(item.read_text(encoding="utf-8")):
                preset = _preset(entry)
                if preset.name in presets:
                    raise ValueError(f"preset {preset.name} defined twice")
                presets[preset.name] = preset
    return MappingProxyType(presets)


@cache
def _aliases() -> Mapping[str, str]:
    """Lower-cased model ids → preset name (an id shared by several presets names the first)."""
    out: dict[str, str] = {}
    for preset in catalogue().values():
        out.setdefault(preset.model_id.lower(), preset.name)
    return MappingProxyType(out)


def find_preset(name: str) -> Preset:
    """The preset named `name` (a slug or a public model id, any case), or a ParameterError saying where to look."""
    key = name.lower()
    found = catalogue().get(key) or catalogue().get(_aliases().get(key, ""))
    if found is None:
        raise ParameterError("preset", f"unknown preset {name[:100]!r}; GET /v1/presets lists every name "
                                       "(a name such as llama-3.1-8b, or the model's public id)")
    return found
