"""Table endpoints: one query model per family, registered once (`service.tables.core.register_table`).

Importing this package registers every family; `TABLES` maps each path to its `TableRoute`.
"""

from service.tables import (
    alibi,
    from_config,
    mrope,
    properties,
    properties_axes,
    properties_learned,
    properties_relative,
    relative,
    rope,
    sinusoidal,
    t5,
    vision_rope,
    xlnet,
)
from service.tables.core import TABLES

FAMILIES = (alibi, from_config, mrope, relative, rope, sinusoidal, t5, vision_rope, xlnet)
# /v1/properties/...: `service.tables.core.PROPERTIES`
PROPERTIES_FAMILIES = (properties, properties_learned, properties_relative, properties_axes)

__all__ = ["FAMILIES", "PROPERTIES_FAMILIES", "TABLES"]
