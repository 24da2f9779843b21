"""The arrays of dynamic batching: requests split into chunks, stacked into one batch (right-padded), and
the batch's outputs handed back per request. Pure numpy; the queue and its scheduling are
`posenc.service.inference.runtime.batcher`.

Every array is batch-first: [rows, ...]. A sequence axis, where given, is the axis of the model's
dynamic sequence dimension (e.g. 2 for `query` [B, H, S, D], 1 for `position_ids` [B, S]).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Arrays = Mapping[str, np.ndarray]


def rows_of(inputs: Arrays) -> int:
    """The batch size of a request (its first tensor's axis 0)."""
    return int(next(iter(inputs.values())).shape[0])


def split_rows(inputs: Arrays, out: Arrays | None, rows: int) -> list[tuple[Arrays, Arrays | None]]:
    """`inputs` (and `out`) split on the batch axis into views of at most `rows` rows (themselves if they fit)."""
    if rows_of(inputs) <= rows:
        return [(inputs, out)]
    return [({name: array[start : start + rows] for name, array in inputs.items()},
             {name: array[start : start + rows] for name, array in out.items()} if out else None)
            for start in range(0, rows_of(inputs), rows)]


def joined(results: list[dict[str, np.ndarray]], out: Arrays | None = None) -> dict[str, np.ndarray]:
    """Chunk results put back together on the batch axis (no copy for a single chunk, nor for the outputs whose
    chunks were written into their rows of `out`)."""
    if len(results) == 1:
        return results[0]
    stacked = {name: np.concatenate([r[name] for r in results], axis=0) for name in results[0]
               if not (out and name in out and all(np.may_share_memory(r[name], out[name]) for r in results))}
    return {name: stacked[name] if name in stacked else (out or {})[name] for name in results[0]}


def stack(inputs: Sequence[Arrays], seqs: Sequence[int], longest: int, name: str,
          seq_axis: int | None) -> np.ndarray:
    """The requests' `name` inputs stacked on the batch axis: [sum(rows), ...]. With `seq_axis`, right-padded
    with zeros to `longest` on that axis (position 0 for position_ids): one allocation and one copy of every
    row; `seqs` are the requests' own sequence lengths."""
    first = inputs[0][name]
    if seq_axis is None:
        return np.concatenate([request[name] for request in inputs], axis=0)
    shape = list(first.shape)
    shape[0], shape[seq_axis] = sum(rows_of(request) for request in inputs), longest
    batched = np.zeros(shape, dtype=first.dtype)  # [sum(rows), ..., longest, ...]
    start = 0
    for request, seq in zip(inputs, seqs, strict=True):
        rows = rows_of(request)
        index: list[slice] = [slice(None)] * first.ndim
        index[0], index[seq_axis] = slice(start, start + rows), slice(0, seq)
        batched[tuple(index)] = request[name]
        start += rows
    return batched


def unstack(outputs: Arrays, rows: Sequence[int], seqs: Sequence[int], outs: Sequence[Arrays | None],
            seq_axes: Mapping[str, int] | None) -> list[dict[str, np.ndarray]]:
    """A batch's outputs [sum(rows), ...] handed back per request: its rows, the padded positions dropped on
    the `seq_axes` (None: the batch was not padded), copied into the request's `outs` arrays where given."""
    longest = max(seqs)
    results, start = [], 0
    for count, seq, out in zip(rows, seqs, outs, strict=True):
        result = {}
        for name, array in outputs.items():
            part = array[start : start + count]  # [count, ...]
            if seq_axes is not None and name in seq_axes and seq != longest:
                index = [slice(None)] * part.ndim
                index[seq_axes[name]] = slice(0, seq)
                part = part[tuple(index)]  # [count, ..., seq, ...]: padded positions dropped
            if out is not None and name in out and out[name].shape == part.shape:
                np.copyto(out[name], part)
                part = out[name]
            result[name] = part
        results.append(result)
        start += count
    return results
