"""Row ranges of a position table: the split that lets a large table be computed block by block.

In the position tables (RoPE, sinusoidal, XLNet's relative sinusoid, vision RoPE, M-RoPE) row r is a
function of row r's position alone, evaluated elementwise (float64 angles, cos and sin, one cast). Their
functions take `rows`, a slice of the table's rows, and compute only those rows, from the same
parameters as the whole table (a RoPE table's `seq_len` stays that of the whole table). Every element
of a block goes through the same operations as in the whole table, so the blocks laid side by side are
the whole table bit for bit (tests/models/test_row_blocks.py holds every family to it).

Numpy only: the service decides the block size and where the blocks run.
"""

from __future__ import annotations


def table_rows(rows: slice | None, total: int) -> range:
    """The rows of a `total`-row table that `rows` selects: None = all of them.

    `rows` is a step-1 slice with explicit or open bounds within 0..total that selects at least one
    row; a negative bound, a step or an empty range is a caller's mistake (ValueError).
    """
    if rows is None:
        return range(total)
    start = 0 if rows.start is None else rows.start
    stop = total if rows.stop is None else rows.stop
    if rows.step not in (None, 1) or not 0 <= start < stop <= total:
        raise ValueError(f"rows {rows} is not a non-empty step-1 range within 0..{total}")
    return range(start, stop)


def row_blocks(total: int, rows_per_block: int) -> list[slice]:
    """Consecutive slices covering rows 0..total, each `rows_per_block` rows long but the last."""
    if total < 1 or rows_per_block < 1:
        raise ValueError(f"need total >= 1 and rows_per_block >= 1, got {total} and {rows_per_block}")
    return [slice(start, min(start + rows_per_block, total)) for start in range(0, total, rows_per_block)]
