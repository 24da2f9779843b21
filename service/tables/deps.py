"""The tables room's typed dependencies: the process's table cache and row blocks."""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, Request

from posenc.service.tables.blocks import RowBlocks
from posenc.service.tables.cache import ByteLRUCache


class TableParts(Protocol):
    """What the tables room reads of the process."""

    table_cache: ByteLRUCache
    row_blocks: RowBlocks


def _parts(request: Request) -> TableParts:
    parts: TableParts = request.app.state.process
    return parts


async def table_cache_of(request: Request) -> ByteLRUCache:
    return _parts(request).table_cache


async def row_blocks_of(request: Request) -> RowBlocks:
    return _parts(request).row_blocks


TableCacheDep = Annotated[ByteLRUCache, Depends(table_cache_of)]
RowBlocksDep = Annotated[RowBlocks, Depends(row_blocks_of)]
