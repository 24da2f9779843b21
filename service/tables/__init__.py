"""Table endpoints: one query model per family, registered once (`service.tables.core.register_table`).

Importing this package registers every family; `TABLES` maps each path to its `TableRoute`.
"""

from service.tables import alibi, relative, rope, sinusoidal, t5
from service.tables.core import TABLES

FAMILIES = (alibi, relative, rope, sinusoidal, t5)

__all__ = ["FAMILIES", "TABLES"]
