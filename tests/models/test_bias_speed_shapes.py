"""Per-head biases without a Python loop per head: bit-identical to the per-head loops they replace,
and shapes with many heads and short lengths (formerly seconds of Python overhead) now cheap.

The references below are the pre-vectorisation per-head loops of `alibi_bias` and `t5_bias`, with
the Toeplitz layout written as index arithmetic, so they share no layout code with the models.
No timed assertions (the machine is shared): the formerly slow shapes count the lines of models/ code a
call executes (`vectorised`), so a regression to the loop fails whatever the machine's speed.
"""

import itertools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import posenc.models.relative
from posenc.models.alibi import alibi_bias, alibi_slopes, bloom_slopes, mpt_slopes
from posenc.models.dtypes import np_dtype
from posenc.models.relative import PER_OFFSET_BLOCK, head_blocks, key_minus_query, toeplitz_heads_view, toeplitz_view
from posenc.models.t5 import t5_bias, t5_buckets, t5_relative_position_bucket
from tests.traced_memory import traced_peak

HEADS = (1, 3, 8, 12, 71)
LENGTHS = ((1, 1), (1, 7), (5, 5), (7, 3), (16, 40))
MODES = ("causal", "symmetric", "bloom", "mpt")
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
# None: the shipped block size (every grid case is one block); 1: one head per block; 40: several
# heads per block with a partial last block, and one head per block for (16, 40) (55 offsets > 40)
BLOCKS = (None, 1, 40)


@pytest.fixture(params=BLOCKS, ids=lambda b: f"block={b or 'default'}")
def block(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Run with `PER_OFFSET_BLOCK` set to the parameter (head_blocks reads it at call time)."""
    if request.param is not None:
        monkeypatch.setattr(posenc.models.relative, "PER_OFFSET_BLOCK", request.param)
    yield posenc.models.relative.PER_OFFSET_BLOCK


def layout(per_offset: np.ndarray, q: int, k: int) -> np.ndarray:
    """out[i, j] = per_offset[j − i + q − 1], by fancy indexing (independent of the strided views)."""
    return per_offset[np.arange(k)[None, :] - np.arange(q)[:, None] + (q - 1)]  # [q, k]


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bit patterns (−inf has one, so bit equality also compares the masked entries)."""
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bit_identical(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape, (what, got.dtype, got.shape)
    assert got.flags.c_contiguous, what
    assert np.array_equal(bits(got), bits(expected)), what


def reference_alibi(num_heads: int, q: int, k: int, mode: str, mask: bool, dtype: str,
                    alibi_bias_max: float = 8.0, heads: Sequence[int] | None = None) -> np.ndarray:
    """`alibi_bias` as it was: one head at a time ([len(heads), q, k] for a subset of the heads)."""
    heads = range(num_heads) if heads is None else heads
    out_dtype = np_dtype(dtype)
    out = np.empty((len(heads), q, k), dtype=out_dtype)
    key_minus_position = key_minus_query(q, k) - (k - q)
    if mode in ("causal", "symmetric"):
        distance = key_minus_position if mode == "causal" else -np.abs(key_minus_position)
        slopes = alibi_slopes(num_heads, alibi_bias_max)
        for row, head in enumerate(heads):
            per_offset = (slopes[head] * distance).astype(out_dtype)  # float64 × int64, cast once
            out[row] = layout(per_offset, q, k)
    else:
        if mode == "bloom":
            slopes, keys = bloom_slopes(num_heads, alibi_bias_max), np.arange(k)
        else:
            slopes, keys = mpt_slopes(num_heads, alibi_bias_max), np.arange(k) - (k - 1)
        for row, head in enumerate(heads):
            per_key = (np.float64(slopes[head]) * keys).astype(np.float32)  # exact product, rounded to float32
            out[row] = per_key.astype(out_dtype)[None, :]
    if mask:
        future = layout(key_minus_position > 0, q, k)
        for row in range(len(heads)):
            out[row][future] = -np.inf
    return out


def reference_t5(weight: np.ndarray, q: int, k: int, bidirectional: bool, offset: int) -> np.ndarray:
    """`t5_bias` as it was: gather per offset for all heads, lay out one head at a time."""
    per_offset = t5_relative_position_bucket(key_minus_query(q, k) - offset, bidirectional)
    values = np.ascontiguousarray(weight.T)[:, per_offset]  # [num_heads, q + k − 1]
    out = np.empty((weight.shape[1], q, k), dtype=weight.dtype)
    for head in range(weight.shape[1]):
        out[head] = layout(values[head], q, k)
    return out


# ------------------------------------------------------------------------------- bit identity


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mask", [False, True], ids=["unmasked", "masked"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("q", "k"), LENGTHS)
def test_alibi_equals_the_per_head_loop(block: int, q: int, k: int, mode: str, mask: bool, dtype: str) -> None:
    for num_heads in HEADS:
        got = alibi_bias(num_heads, q, k, mode, mask, dtype=dtype)  # type: ignore[arg-type]
        assert_bit_identical(got, reference_alibi(num_heads, q, k, mode, mask, dtype), f"{num_heads} heads")


@pytest.mark.parametrize("mode", MODES)
def test_alibi_equals_the_per_head_loop_for_other_bias_max(block: int, mode: str) -> None:
    for alibi_bias_max in (0.5, 3.0, 16.0):
        got = alibi_bias(71, 16, 40, mode, True, alibi_bias_max, "bfloat16")  # type: ignore[arg-type]
        assert_bit_identical(got, reference_alibi(71, 16, 40, mode, True, "bfloat16", alibi_bias_max),
                             f"alibi_bias_max={alibi_bias_max}")


@pytest.mark.parametrize("offset", [0, 5])
@pytest.mark.parametrize("bidirectional", [True, False], ids=["bidirectional", "causal"])
@pytest.mark.parametrize("weight_dtype", [np.float32, np.float16, ml_dtypes.bfloat16],
                         ids=["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("q", "k"), LENGTHS)
def test_t5_equals_the_per_head_loop(block: int, q: int, k: int, weight_dtype: type, bidirectional: bool,
                                     offset: int) -> None:
    rng = np.random.default_rng(q * 1000 + k)
    for num_heads in HEADS:
        weight: np.ndarray = rng.standard_normal((32, num_heads)).astype(weight_dtype)  # [num_buckets, num_heads]
        got = t5_bias(weight, q, k, bidirectional, offset=offset)
        assert_bit_identical(got, reference_t5(weight, q, k, bidirectional, offset), f"{num_heads} heads")


def test_t5_accepts_a_non_contiguous_weight(block: int) -> None:
    # e.g. a column slice of a larger table, or a Fortran-order upload
    base = np.random.default_rng(1).standard_normal((32, 24)).astype(np.float16)
    for weight in (base[:, ::2], np.asfortranarray(base)):
        assert_bit_identical(t5_bias(weight, 16, 40), reference_t5(np.ascontiguousarray(weight), 16, 40, True, 0),
                             str(weight.strides))


# -------------------------------------------------------------------------------- the helpers


@pytest.mark.parametrize(("q", "k"), LENGTHS)
def test_toeplitz_heads_view_lays_out_every_leading_index(q: int, k: int) -> None:
    per_offset = np.arange(2 * 3 * (q + k - 1)).reshape(2, 3, q + k - 1)
    view = toeplitz_heads_view(per_offset, q, k)  # [2, 3, q, k]
    assert view.shape == (2, 3, q, k) and not view.flags.writeable
    for a in range(2):
        for b in range(3):
            np.testing.assert_array_equal(view[a, b], layout(per_offset[a, b], q, k))
            np.testing.assert_array_equal(view[a, b], toeplitz_view(per_offset[a, b], q, k))


def test_toeplitz_views_check_the_offset_axis() -> None:
    with pytest.raises(ValueError, match=r"need \(\.\.\., 4\)"):
        toeplitz_heads_view(np.zeros((3, 5)), 2, 3)
    with pytest.raises(ValueError, match=r"need \(\.\.\., 4\)"):
        toeplitz_heads_view(np.float64(0.0), 2, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"need \(4,\)"):
        toeplitz_view(np.zeros((1, 4)), 2, 3)  # the 1-D view stays 1-D only


@pytest.mark.parametrize("num_heads", [1, 2, 7, 1000, 100_000])
@pytest.mark.parametrize(("q", "k"), [(1, 1), (1, 2), (300, 300), (1, PER_OFFSET_BLOCK), (1 << 24, 1 << 24)])
def test_head_blocks_cover_the_heads_with_bounded_work_per_block(num_heads: int, q: int, k: int) -> None:
    width = q + k - 1
    blocks = list(head_blocks(num_heads, q, k))
    assert blocks[0].start == 0 and blocks[-1].stop == num_heads
    assert all(a.stop == b.start for a, b in itertools.pairwise(blocks))
    sizes = [s.stop - s.start for s in blocks]
    assert min(sizes) >= 1
    # a block holds at most PER_OFFSET_BLOCK per-offset values unless it is a single head
    assert all(size == 1 or size * width <= PER_OFFSET_BLOCK for size in sizes)
    # ... and, the last one aside, at least half of that: the loop's overhead is amortised
    assert all(size * width > PER_OFFSET_BLOCK // 2 for size in sizes[:-1])
    assert len(blocks) <= 2 * num_heads * width / PER_OFFSET_BLOCK + 1


# ----------------------------------------------------------------------- the formerly slow shapes


# The per-head loops took ~15 s (ALiBi) and ~9 s (T5) per call on the machine: Python work per
# head. Each call below is held to a number of executed lines of models/ code that does not grow with the
# heads (a few per block of heads; a loop over 2^16..2^20 heads executes millions), counted, not timed.
MAX_PYTHON_LINES = 1_000


class TooMuchPython(Exception):
    """Raised inside the traced call once it has executed more than MAX_PYTHON_LINES lines of models/."""


def vectorised(function: Callable[..., np.ndarray], *args: Any, **kwargs: Any) -> np.ndarray:
    """`function(*args, **kwargs)`, failing the test if it executed more than MAX_PYTHON_LINES lines of models/
    code (traced with sys.settrace, stopped as soon as it passes them)."""
    models_dir = str(Path(posenc.models.relative.__file__).parent) + os.sep
    lines = 0

    def count(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        nonlocal lines
        if event == "line":
            lines += 1
            if lines > MAX_PYTHON_LINES:
                raise TooMuchPython
        return count

    def trace(frame: FrameType, event: str, arg: object) -> Callable[..., object] | None:
        return count if frame.f_code.co_filename.startswith(models_dir) else None

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        return function(*args, **kwargs)
    except TooMuchPython:
        pytest.fail(f"more than {MAX_PYTHON_LINES} lines of models/ executed: a Python loop per head?")
    finally:
        sys.settrace(previous)


def test_alibi_many_heads_short_lengths() -> None:
    num_heads = 1 << 20
    out = vectorised(alibi_bias, num_heads, 1, 2, "symmetric")  # the request
    assert out.shape == (num_heads, 1, 2) and out.dtype == np.float32 and out.flags.c_contiguous
    slopes = alibi_slopes(num_heads)
    # the query sits at position 1: key 0 is one step away, key 1 is the query itself
    np.testing.assert_array_equal(out[:, 0, 0], -slopes.astype(np.float32))
    assert not out[:, 0, 1].any()
    spot = (0, 1, 12345, num_heads // 2 + 7, num_heads - 1)
    for head in spot:
        assert_bit_identical(out[head: head + 1], (slopes[head: head + 1, None, None] * np.array([-1, 0]))
                             .astype(np.float32), f"head {head}")
    for mode in ("causal", "symmetric"):
        for dtype in FLOAT_DTYPES:
            for mask in (False, True):
                out = vectorised(alibi_bias, num_heads, 1, 2, mode, mask, dtype=dtype)
                assert out.shape == (num_heads, 1, 2) and out.dtype == np_dtype(dtype)
                expected = reference_alibi(num_heads, 1, 2, mode, mask, dtype, heads=spot)
                assert_bit_identical(out[list(spot)], expected, f"{mode} {dtype} mask={mask}")


def test_t5_many_heads_short_lengths() -> None:
    weight = np.random.default_rng(2).standard_normal((32, 500_000)).astype(np.float16)
    out = vectorised(t5_bias, weight, 1, 1)  # the request
    assert out.shape == (500_000, 1, 1) and out.dtype == np.float16 and out.flags.c_contiguous
    assert t5_buckets(1, 1)[0, 0] == 0  # offset 0 is bucket 0
    assert_bit_identical(out[:, 0, 0].copy(), weight[0], "bucket 0 of every head")
    for cast in (np.float16, np.float32, ml_dtypes.bfloat16):
        typed = weight.astype(cast)
        for q, k in ((1, 1), (1, 2), (2, 1)):
            for bidirectional in (True, False):
                out = vectorised(t5_bias, typed, q, k, bidirectional, offset=3)
                assert out.shape == (500_000, q, k) and out.dtype == typed.dtype
                buckets = t5_buckets(q, k, bidirectional, offset=3)  # [q, k]
                expected = np.moveaxis(typed[buckets], -1, 0)  # [num_heads, q, k], gathered per element
                assert_bit_identical(out, np.ascontiguousarray(expected), f"{cast} {q}x{k} {bidirectional}")


@pytest.mark.parametrize(("num_heads", "q", "k"), [
    (1 << 20, 1, 1), (1, 1, 1 << 20), (1, 1 << 20, 1), (1 << 16, 4, 4), (4096, 1, 256), (1024, 32, 32),
])
def test_every_split_of_a_million_elements_is_cheap(num_heads: int, q: int, k: int) -> None:
    spot = sorted({0, num_heads // 3, num_heads - 1})  # first, middle and last block's heads
    for mode in MODES:
        out = vectorised(alibi_bias, num_heads, q, k, mode, mask=True, dtype="bfloat16")
        assert out.shape == (num_heads, q, k) and out.dtype == ml_dtypes.bfloat16
        expected = reference_alibi(num_heads, q, k, mode, True, "bfloat16", heads=spot)
        assert_bit_identical(out[spot], expected, mode)
    weight = np.random.default_rng(3).standard_normal((32, num_heads)).astype(np.float32)
    out = vectorised(t5_bias, weight, q, k, bidirectional=False)
    assert out.shape == (num_heads, q, k)
    buckets = t5_buckets(q, k, bidirectional=False)  # [q, k]
    for head in (0, num_heads - 1):
        np.testing.assert_array_equal(out[head], weight[buckets, head])


# ------------------------------------------------------------------------------------- memory


@pytest.mark.parametrize("compute", [
    lambda: alibi_bias(4096, 1, 1024, "symmetric", dtype="float16"),
    lambda: alibi_bias(4096, 1024, 1, "causal", mask=True, dtype="bfloat16"),
    lambda: alibi_bias(4096, 1, 1024, "bloom", dtype="float16"),
    lambda: alibi_bias(4096, 1, 1024, "mpt", mask=True, dtype="bfloat16"),
    lambda: t5_bias(np.ones((32, 4096), np.float16), 1, 1024),
    lambda: t5_bias(np.ones((32, 4096), np.float16), 1024, 1),
], ids=["symmetric", "causal", "bloom", "mpt", "t5-q1", "t5-k1"])
def test_memory_stays_near_the_output_when_a_length_is_one(compute: Callable[[], np.ndarray]) -> None:
    # q = 1 or k = 1: the per-offset values of all heads are as many as the output's elements, so
    # evaluating them at once (in float64 for ALiBi) would hold 1× to 5× the output on top of it
    out, peak = traced_peak(compute)
    assert peak <= 1.3 * out.nbytes + 2**20, (peak, out.nbytes)
