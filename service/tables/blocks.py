"""Large uncached tables computed in row blocks on every core.

A family whose rows can be computed in any range on their own (`TableQuery.row_tensors`, `compute_rows`:
the position tables) is split into blocks of about `POSENC_TABLE_BLOCK_BYTES` of output, computed on a
pool of `POSENC_TABLE_THREADS` threads shared by every request (numpy's elementwise loops release the
GIL), each block written into its rows of the preallocated output. The blocks are the table bit for bit
(`posenc.models.row_blocks`). Smaller blocks also keep a block's float64 temporaries in the CPU's cache,
so the split pays even on one core.

A request whose client left stops at its next block (`posenc.service.request_kit.work`): the blocks not started are
dropped, those running finish.

Memory: the output tensors, their encoded body and the send buffer as for any table, plus, per block in
flight (at most one per thread), that block's own estimate (`TableQuery.working_bytes` of a table of
its rows: its tensors and float64 temporaries) instead of the whole table's temporaries.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np

from posenc.models.row_blocks import row_blocks
from posenc.service.codec.encode import Bundle
from posenc.service.request_kit import work
from posenc.service.settings import usable_cores
from posenc.service.tables.registry import TableQuery, TensorSpec


class RowBlocks:
    """Where tables are computed: in one piece, or in row blocks of about `block_bytes` of output on a pool
    of `threads` (created with its first block); `block_bytes` 0 computes every table in one piece."""

    def __init__(self, threads: int, block_bytes: int) -> None:
        self.threads = threads if threads > 0 else usable_cores()
        self.block_bytes = block_bytes
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def blocks(self, query: TableQuery, specs: Mapping[str, TensorSpec]) -> list[slice] | None:
        """The row blocks of this table, or None when it is computed in one piece (no `row_tensors`, splitting
        off, or at most one block of rows)."""
        if not query.row_tensors or self.block_bytes <= 0:
            return None
        if not set(query.row_tensors) <= set(specs):
            raise RuntimeError(f"{type(query).__name__}: row_tensors {query.row_tensors} not among {list(specs)}")
        rows = specs[query.row_tensors[0]].shape[0]
        if rows < 2:
            return None
        row_bytes = sum(specs[name].nbytes for name in query.row_tensors) // rows
        per_block = max(1, self.block_bytes // max(row_bytes, 1))
        return row_blocks(rows, per_block) if rows > per_block else None

    def working_bytes(self, query: TableQuery, specs: Mapping[str, TensorSpec]) -> int:
        """What computing this table holds at most (reserved in the `MemoryBudget` before it starts)."""
        blocks = self.blocks(query, specs)
        if blocks is None:
            return query.working_bytes(specs)
        largest = blocks[0].stop - blocks[0].start  # the first block is never shorter than the others
        block_specs = {name: TensorSpec((largest, *spec.shape[1:]), spec.dtype) if name in query.row_tensors
                       else spec for name, spec in specs.items()}
        in_flight = min(self.threads, len(blocks))
        # whole: the output, its encoding and the send buffer; each block in flight: its own estimate (its
        # tensors and temporaries; also a block-sized encoding that blocks never make: a small surplus)
        return TableQuery.working_bytes(query, specs) + in_flight * query.working_bytes(block_specs)

    def compute(self, query: TableQuery, specs: Mapping[str, TensorSpec]) -> Bundle:
        """`query.compute()`, in row blocks on the pool when the table has more than one (blocking: call from a
        worker thread, never from a block)."""
        blocks = self.blocks(query, specs)
        if blocks is None:
            return query.compute()
        out = {name: np.empty(specs[name].shape, specs[name].dtype) for name in query.row_tensors}
        request = work.current()  # the pool's threads do not run in the request's context: handed on here

        def block(rows: slice) -> Bundle:
            if request is not None:
                request.check()
            part = query.compute_rows(rows)
            for name, array in out.items():
                array[rows] = part.tensors[name]
            # the rest (tensors outside the rows, metadata) is the same in every block
            return Bundle({n: t for n, t in part.tensors.items() if n not in out}, part.metadata)

        pool = self._executor()
        futures: list[Future[Bundle]] = [pool.submit(block, rows) for rows in blocks]
        try:
            parts = [future.result() for future in futures]  # every block done (or the first error)
        except BaseException:
            for future in futures:
                future.cancel()
            wait(futures)  # blocks already running finish before their memory's reservation is given back
            raise
        tensors = {**parts[0].tensors, **out}
        return Bundle({name: tensors[name] for name in specs if name in tensors}, parts[0].metadata)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="posenc-table")
            return self._pool

    def close(self) -> None:
        """Stop the threads once their blocks are done; blocks not started yet are dropped."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
