"""`GET /v1/properties/...`: what a family's table does (docs/PROPERTIES.md), as named curves and a summary.

Importing this package registers every properties endpoint in `service.tables.TABLES`, beside the tables
whose query models they extend.
"""

from service.properties import axes, families, learned, relative  # noqa: F401
from service.tables import TABLES

__all__ = ["TABLES"]
