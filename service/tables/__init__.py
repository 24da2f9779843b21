"""Table endpoints: one query model per family, registered once (`service.tables.registry.register_table`).

Importing this package registers every table family; `TABLES` maps each path to its `TableRoute`. The
properties endpoints register into the same map when `service.properties` is imported.
"""

from service.tables import alibi, from_config, mrope, relative, rope, sinusoidal, t5, vision_rope, xlnet  # noqa: F401
from service.tables.registry import TABLES

__all__ = ["TABLES"]
