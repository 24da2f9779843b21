"""Row blocks: every position table computed block by block (`rows=`) is the whole table bit for bit, for every
family and layout, every served float dtype (bfloat16 through the round-to-odd cast included), and block sizes
that do not divide the table; the row ranges themselves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from posenc.models.mrope import Segment, mrope_cos_sin, mrope_position_ids
from posenc.models.rope import rope_cos_sin
from posenc.models.rope_params import make_rope_parameters
from posenc.models.rope_types import ROPE_TYPES
from posenc.models.row_blocks import row_blocks, table_rows
from posenc.models.sinusoidal import sinusoidal_table
from posenc.models.vision_rope import vision_cos_sin, vision_positions
from posenc.models.xlnet import xlnet_relative_sinusoid
from tests.models.test_rope_registry import VALUES

FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
# rows per block: one row, a few (a partial last block), most of the table (two uneven blocks)
BLOCK_ROWS = (1, 7, 64)

# A table function of (dtype, rows) → its row tensors: [rows, ...] arrays (the rest must not depend on rows).
Table = Callable[[str, slice | None], tuple[np.ndarray, ...]]


def _rope(name: str, head_dim: int, max_position: int, offset: int, partial_rotary_factor: float | None = None,
          **kwargs: Any) -> Table:
    spec = ROPE_TYPES[name]
    values = {k: v for k, v in VALUES.items() if k in spec.reads}  # longrope: 8 factors for head_dim 16
    params = make_rope_parameters(head_dim=head_dim, rope_type=name, max_position_embeddings=128,
                                  partial_rotary_factor=partial_rotary_factor, **values)

    def table(dtype: str, rows: slice | None) -> tuple[np.ndarray, ...]:
        cos, sin, info = rope_cos_sin(params, max_position, offset, dtype=dtype, rows=rows, **kwargs)
        return cos, sin, info.inv_freq, np.array([info.attention_factor, info.seq_len])
    return table


def _sinusoidal(max_position: int, dim: int, variant: Any, offset: int = 0, padding_idx: int = 1) -> Table:
    def table(dtype: str, rows: slice | None) -> tuple[np.ndarray, ...]:
        return (sinusoidal_table(max_position, dim, variant, 10000.0, offset, padding_idx, dtype, rows),)
    return table


def _xlnet(qlen: int, klen: int, d_model: int, attn_type: Any, bi_data: bool, clamp_len: int) -> Table:
    def table(dtype: str, rows: slice | None) -> tuple[np.ndarray, ...]:
        return (xlnet_relative_sinusoid(qlen, klen, d_model, attn_type, bi_data, clamp_len, dtype, rows),)
    return table


def _vision(model: Any, head_dim: int, height: int, width: int, form: Any) -> Table:
    def table(dtype: str, rows: slice | None) -> tuple[np.ndarray, ...]:
        return vision_cos_sin(model, head_dim, 10000.0, height, width, form, dtype, rows)
    return table


def _mrope(interleaved: bool, rope_type: str = "default") -> Table:
    segments = [Segment("text", 5), Segment("image", grid_thw=(1, 8, 12)), Segment("text", 9),
                Segment("video", grid_thw=(3, 4, 6))]
    ids, _ = mrope_position_ids(segments, "qwen2_vl", 2, sequence_length=70, padding_side="left")
    extra = {"factor": 2.0} if rope_type == "dynamic" else {}
    params = make_rope_parameters(head_dim=24, rope_type=rope_type, max_position_embeddings=8, **extra)

    def table(dtype: str, rows: slice | None) -> tuple[np.ndarray, ...]:
        cos, sin, inv_freq, factor = mrope_cos_sin(params, ids, (4, 4, 4), interleaved, dtype, rows)
        return cos, sin, inv_freq, np.array([factor])
    return table


TABLES: dict[str, Table] = {
    **{f"rope-{name}": _rope(name, 16, 300, 0) for name in ROPE_TYPES},  # past 128: long-context forms
    "rope-odd-width-offset": _rope("default", 6, 131, 1000),
    "rope-interleaved": _rope("default", 10, 100, 3, layout="interleaved"),
    "rope-half-form": _rope("yarn", 16, 99, 0, form="half"),
    "rope-partial-llama3": _rope("llama3", 20, 97, 5, partial_rotary_factor=0.6),
    **{f"sinusoidal-{variant}": _sinusoidal(103, 13, variant) for variant in ("paper", "tensor2tensor", "marian")},
    "sinusoidal-fairseq-padding-row": _sinusoidal(103, 14, "fairseq", offset=2, padding_idx=50),
    "sinusoidal-fairseq-padding-first-row": _sinusoidal(103, 14, "fairseq", offset=1, padding_idx=1),
    "xlnet-bi": _xlnet(40, 61, 12, "bi", False, -1),
    "xlnet-uni-bi-data-clamped": _xlnet(40, 61, 12, "uni", True, 20),
    "vision-pixtral-full": _vision("pixtral", 16, 9, 13, "full"),
    "vision-pixtral-half": _vision("pixtral", 12, 13, 9, "half"),
    "vision-llama4-full": _vision("llama4", 16, 10, 10, "full"),  # 101 rows: the CLS row last
    "vision-llama4-half": _vision("llama4", 8, 11, 11, "half"),
    "mrope-contiguous": _mrope(False),
    "mrope-interleaved-dynamic": _mrope(True, "dynamic"),
}


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shapes, dtypes and bytes (so −0.0 ≠ 0.0, unlike ==)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("name", list(TABLES))
def test_blocks_side_by_side_are_the_whole_table_bit_for_bit(name: str, dtype: str) -> None:
    table = TABLES[name]
    whole = table(dtype, None)
    total = whole[0].shape[0]
    for per_block in BLOCK_ROWS:
        parts = [table(dtype, rows) for rows in row_blocks(total, per_block)]
        for i, array in enumerate(whole):
            if array.ndim and array.shape[0] == total and i < 2:  # the row tensors
                joined = np.concatenate([part[i] for part in parts])
                assert _same_bits(joined, array), f"tensor {i}, {per_block} rows per block"
            else:  # the rest: the same in every block
                assert all(_same_bits(part[i], array) for part in parts), f"tensor {i}"


@pytest.mark.parametrize(("rows", "total", "expected"), [
    (None, 5, range(5)), (slice(None), 5, range(5)), (slice(2, None), 5, range(2, 5)),
    (slice(None, 3), 5, range(3)), (slice(4, 5, 1), 5, range(4, 5)),
])
def test_table_rows_selects_a_range(rows: slice | None, total: int, expected: range) -> None:
    assert table_rows(rows, total) == expected


@pytest.mark.parametrize("rows", [slice(3, 3), slice(4, 2), slice(-1, None), slice(0, 6), slice(0, 4, 2)])
def test_table_rows_refuses_what_is_not_a_range_of_the_table(rows: slice) -> None:
    with pytest.raises(ValueError, match=r"non-empty step-1 range within 0\.\.5"):
        table_rows(rows, 5)


@pytest.mark.parametrize(("total", "per_block"), [(1, 1), (1, 10), (10, 10), (11, 10), (100, 7), (5, 1)])
def test_row_blocks_cover_the_table_once_in_order(total: int, per_block: int) -> None:
    blocks = row_blocks(total, per_block)
    assert [i for block in blocks for i in range(block.start, block.stop)] == list(range(total))
    assert all(block.stop - block.start == per_block for block in blocks[:-1])
    assert 1 <= blocks[-1].stop - blocks[-1].start <= per_block


def test_vision_positions_of_a_block_are_those_rows_of_the_grid() -> None:
    whole = vision_positions("llama4", 5, 5)
    assert whole.tolist()[-1] == [0, 0] and whole.shape == (26, 2)  # the CLS row
    assert (vision_positions("llama4", 5, 5, slice(20, 26)) == whole[20:]).all()
    assert (vision_positions("pixtral", 3, 7, slice(5, 9)) == vision_positions("pixtral", 3, 7)[5:9]).all()
