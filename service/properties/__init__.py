"""`GET /v1/properties/...`: what a family's table does (docs/properties.md), as named curves and a summary.

Importing this package registers every properties endpoint in `posenc.service.tables.TABLES`, beside the tables
whose query models they extend; every module here is imported, in name order.
"""

import importlib
import pkgutil

from posenc.service.tables import TABLES

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["TABLES"]
