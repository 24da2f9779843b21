"""`?preset=NAME` on every table, properties and check route: the preset's parameters under the explicit ones.

A query model's `preset_table` names the table kind it serves (`posenc.models.presets.tables.TABLE_KINDS`);
`expand_preset` runs before the model validates (a pydantic before-validator), so a preset supplies required
parameters too and the validated query holds the resolved values: its canonical parameters, cache entry and
ETag are those of the spelled-out request. Explicit parameters win; a parameter that names another model
than the preset's (`model` of M-RoPE and vision RoPE) or a route the preset has no table for is a 422 naming both.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from posenc.models.errors import ParameterError
from posenc.models.presets import catalogue, find_preset
from posenc.models.presets.tables import preset_values
from posenc.service.errors import InvalidParameter

# parameters whose value names the model itself: an explicit one must be the preset's
MODEL_PARAMETERS = ("model",)

PRESET_DESCRIPTION = ("A model from the bundled catalogue (GET /v1/presets): its slug (e.g. llama-3.1-8b) or its "
                      "public id (meta-llama/Llama-3.1-8B), any case. Fills every model parameter of this route; "
                      "explicit parameters override it.")
# the description of a required parameter every preset of the route fills (the OpenAPI document; the schemathesis
# run's hooks read it: a request with `preset` and without such a parameter is no schema violation the server
# must refuse)
PRESET_FILLS = "With `preset`, it may be left out (every preset of this route fills it)."


def preset_names(kind: str | None = None) -> list[str]:
    """Every preset's slug; with `kind`, those that fill that table kind (the OpenAPI enum of a route's `preset`:
    another model's slug is refused there, 422)."""
    return [name for name, preset in catalogue().items() if kind is None or kind in preset.tables]


@cache
def preset_fills(kind: str) -> frozenset[str]:
    """The parameters every preset of table kind `kind` fills: a route's required parameter among them may be left
    out with `?preset=`, as its description in the OpenAPI document says (`PRESET_FILLS`)."""
    filled = [set(preset_values(preset, kind)) for preset in catalogue().values() if kind in preset.tables]
    return frozenset(set.intersection(*filled)) if filled else frozenset()


def expand_preset(kind: str | None, endpoint: str, data: Any, fields: Mapping[str, Any]) -> Any:
    """The raw query `data` with the preset's values for the model's `fields` beneath the explicit ones."""
    if not isinstance(data, Mapping) or data.get("preset") is None:
        return data
    name = data["preset"]
    if not isinstance(name, str) or not name:  # `preset=` is no name, as an empty value is for every parameter
        raise InvalidParameter("preset: must be a preset name (GET /v1/presets lists them)")
    try:
        preset = find_preset(name)
    except ParameterError as exc:
        raise InvalidParameter(str(exc)) from None
    if kind is None or kind not in preset.tables:
        raise InvalidParameter(f"preset: {preset.name} is a {preset.family} model (tables: "
                               f"{', '.join(preset.tables)}); /v1/{endpoint} serves none of them")
    try:
        values = preset_values(preset, kind)
    except ParameterError as exc:  # a catalogue entry the resolver refuses: the catalogue tests prevent it
        raise InvalidParameter(f"preset: {preset.name}: {exc}") from None
    for name in MODEL_PARAMETERS:
        given = data.get(name)
        if name in values and given is not None and str(given) != str(values[name]):
            raise InvalidParameter(f"{name}: {given!r} contradicts preset {preset.name}, whose {name} is "
                                   f"{values[name]!r}; leave out one of them")
    return {**{key: value for key, value in values.items() if key in fields}, **data}
