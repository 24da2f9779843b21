"""The tables room's typed dependencies: its cache and row blocks, which `create_app` (`posenc.service.http.app`)
puts on the app's state."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from posenc.service.tables.blocks import RowBlocks
from posenc.service.tables.cache import ByteLRUCache


async def table_cache_of(request: Request) -> ByteLRUCache:
    cache: ByteLRUCache = request.app.state.table_cache
    return cache


async def row_blocks_of(request: Request) -> RowBlocks:
    blocks: RowBlocks = request.app.state.row_blocks
    return blocks


TableCacheDep = Annotated[ByteLRUCache, Depends(table_cache_of)]
RowBlocksDep = Annotated[RowBlocks, Depends(row_blocks_of)]
