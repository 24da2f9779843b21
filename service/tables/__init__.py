"""Table endpoints: one query model per family, registered once (`posenc.service.tables.registry.register_table`).

Importing this package registers every table family; `TABLES` maps each path to its `TableRoute`. Every
module here other than the shared machinery is a family, imported in name order: adding a family is adding
its module (its query model), its math in models/ and its tests. The properties endpoints register into the
same map when `posenc.service.properties` is imported.
"""

import importlib
import pkgutil

from posenc.service.tables.registry import TABLES

# The machinery every family shares (tests/rules/test_module_names.py: none registers a table); every other module of
# this package is a family and registers at least one.
MACHINERY = frozenset({"answer", "blocks", "cache", "deps", "fields", "png", "preset", "registry", "routes"})

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in MACHINERY:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["TABLES"]
