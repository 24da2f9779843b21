"""What a table computed in row blocks reserves, against the arithmetic written out here: the whole output
(tensors, encoding, send buffer: three times their bytes) plus, per block in flight, the estimate of a table
of the *longest* block's rows (the first: the last block is the short one)."""

from __future__ import annotations

import pytest

from posenc.service.tables.blocks import RowBlocks
from posenc.service.tables.rope import RopeQuery

HEAD_DIM = 64
ROW_BYTES = 2 * HEAD_DIM * 2  # cos and sin, bfloat16: 256 bytes a row
INV_FREQ_BYTES = HEAD_DIM // 2 * 4  # float32 [32]
BLOCK_BYTES = 64 * 1024  # 256 rows a block


def _expected(rows: int, block_rows: int, in_flight: int) -> int:
    whole = 3 * (rows * ROW_BYTES + INV_FREQ_BYTES)
    # a block's tensors (encoded and sent as any table) and its float64 angles, cos and sin [rows, d/2]
    block = 3 * (block_rows * ROW_BYTES + INV_FREQ_BYTES) + 3 * 8 * block_rows * (HEAD_DIM // 2)
    return whole + in_flight * block


@pytest.mark.parametrize(("rows", "threads", "in_flight"), [
    (5000, 3, 3),  # 19 blocks of 256 rows and one of 136
    (600, 8, 3),  # 256, 256 and 88 rows: no more blocks in flight than there are
    (257, 1, 1),  # 256 rows and 1
])
def test_a_split_table_reserves_its_output_and_its_longest_block_per_thread(rows: int, threads: int,
                                                                            in_flight: int) -> None:
    query = RopeQuery(max_position=rows, head_dim=HEAD_DIM, dtype="bfloat16")
    specs = query.specs()
    blocks = RowBlocks(threads, BLOCK_BYTES)
    split = blocks.blocks(query, specs)
    assert split is not None and split[0] == slice(0, 256) and split[-1].stop - split[-1].start == (rows - 1) % 256 + 1
    assert blocks.working_bytes(query, specs) == _expected(rows, 256, in_flight)
