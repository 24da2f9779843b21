"""Dynamic batching per model: an asyncio queue drained by one dispatcher task.

Requests (dicts of batch-first arrays, already validated) are queued; the dispatcher takes the oldest
request and the queued requests compatible with it (same shapes apart from the batch axis — and apart
from the sequence axis when `seq_axes` is given, i.e. for causal models, which are right-padded to the
longest sequence) up to `max_batch_size` rows, concatenates them once, runs the model in a worker
thread and hands every request its own rows. Requests larger than `max_batch_size` are split into
chunks and reassembled. Up to `max_runs` batches of a model run at a time (the worker threads: as many
runs as batching off would have in flight, so that batching never serialises what would otherwise
overlap); the requests that arrive while every run is taken form the next batch.

So batching never waits by default (`max_queue_delay_us=0`): a request that finds the model idle runs
at once, alone, and batches form only from requests that are actually waiting. A positive delay makes
the first request of a batch wait up to that long for a full batch — only worth it where a bigger batch
costs less per row (a GPU; `python -m bench batching` prints onnxruntime's per-row cost by batch size).

Right-padding is exact for the valid rows of a causal model: query i only attends keys 0..i, so keys
appended after a request's last token never reach its queries; the padded output rows are dropped.
A batch that fails is retried request by request, so one bad request cannot fail its neighbours.

With a `run_budget` and a `run_bytes(rows, seq)` cost, no run holds more than the budget's capacity
(requests are split into chunks of rows that fit, batches stop growing before they exceed it) and the
runs of every model together stay under it: a run waits for its bytes before it starts.

A batch saves each run's fixed cost (onnxruntime's per-run and per-node overhead, the hand-off to a thread).
Where a request's rows take `batch_below_us` or longer to run (at the cost per row of the last run of its
batch key and sequence length, batched or not), there is little of it left to save, and on a CPU a batch
can cost more per row than its requests run one by one: rope_attention at S=256 costs 1.5-1.75 ms per row
alone and 1.7-2.3 ms per row in runs of 2 to 8 (2 cores), and batching there cut the throughput of 16
clients by a fifth. Such requests run one by one, by batching off's path: without the dispatcher or a run slot,
queued in the worker threads (the engine gives them `max_runs` threads, so still up to that many at a time), so
that each starts as soon as a thread is free. The engine passes no bound for a GPU, whose parallelism a batch
fills.

A run whose shape (the batch key, rows and sequence length) last ran in less than `inline_run_us` runs on
the event loop itself: handing it to a worker thread and back (a queue, a thread wake-up, the GIL twice, a
call back into the loop) costs about as much as such a run, which holds the loop for at most about that
bound. The first run of a shape, and any shape whose last run took longer, goes to a worker thread.

The array work (chunks, stacking with right-padding, handing each request its rows) is
`posenc.service.inference.runtime.batch_arrays`; this module is the queue and its scheduling.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from posenc.service.budget import MemoryBudget
from posenc.service.errors import Unavailable
from posenc.service.inference.runtime.batch_arrays import Arrays, joined, rows_of, split_rows, stack, unstack
from posenc.service.inference.runtime.run_times import BatchKey, RunTimes, Shape
from posenc.service.request_kit import phases

log = logging.getLogger("posenc.inference.batcher")

RunFn = Callable[..., dict[str, np.ndarray]]  # (inputs[, out]) -> outputs: `run_model` of one model
RunBytes = Callable[[int, int], int]  # (rows, sequence length) -> bytes one run of them holds
T = TypeVar("T")


class BatchObserver(Protocol):
    """Where a batcher reports what it does (`posenc.service.metrics.Metrics`); called from worker threads too."""

    def observe_batch(self, model: str, size: int) -> None: ...

    def set_queue_depth(self, model: str, depth: int) -> None: ...

    def observe_run(self, model: str, seconds: float) -> None: ...


# Padding may at most double the work of a batch (padded elements <= valid elements).
MAX_PADDING_RATIO = 2.0


@dataclass(eq=False)  # identity equality: the queue removes items by identity, never compares arrays
class _Item:
    """One chunk (<= max_batch_size rows) of one request, waiting for its rows of a batch."""

    inputs: Arrays
    rows: int
    seq: int
    key: BatchKey
    future: asyncio.Future[dict[str, np.ndarray]] = field(repr=False)
    out: Arrays | None = field(default=None, repr=False)  # the chunk's rows of the request's output arrays
    run_seconds: float = 0.0  # the run that answered it (a batch's, shared)


class Batcher:
    """`await submit(inputs)` → the model's outputs for exactly these inputs."""

    def __init__(
        self, run: RunFn, executor: Executor, *, max_batch_size: int, max_queue_delay_us: int, max_queue_size: int,
        batching: bool = True, seq_axes: Mapping[str, int] | None = None, pad: bool = False, name: str = "model",
        observer: BatchObserver | None = None, run_bytes: RunBytes | None = None,
        run_budget: MemoryBudget | None = None, inline_run_us: int = 0, max_runs: int = 1, batch_below_us: int = 0,
    ) -> None:
        self.run = run
        self.executor = executor
        self.max_batch_size = max(1, max_batch_size)
        self.delay = max_queue_delay_us / 1e6
        self.max_queue_size = max_queue_size
        self.batching = batching
        self.seq_axes = dict(seq_axes) if seq_axes else None  # tensor name -> its sequence axis
        self.pad = pad and self.seq_axes is not None  # batch different lengths, right-padded (causal models)
        self.run_bytes = run_bytes if run_budget is not None else None
        self.run_budget = run_budget
        self.name = name
        self.observer = observer
        self.inline_below = inline_run_us / 1e6
        self.batch_below = batch_below_us / 1e6 if batch_below_us else math.inf
        self.run_times = RunTimes()  # what the runs of each shape took: the choices below are made from it
        self.inline_runs = 0  # runs made on the event loop (no worker thread)
        self._queue: collections.deque[_Item] = collections.deque()
        self._waiting_requests = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.max_runs = max(1, max_runs)
        self._slots: asyncio.Semaphore | None = None  # one per run that may be in flight
        self._runs: set[asyncio.Task[None]] = set()
        # Statistics (Triton's names): rows inferred and model executions; bumped from worker threads.
        self._stats_lock = threading.Lock()
        self.inference_count = 0
        self.execution_count = 0

    @property
    def busy(self) -> bool:
        """Whether a request holds a place (from before its body is read to its answer) or a run is in flight."""
        return self._waiting_requests > 0 or bool(self._runs)

    @contextlib.contextmanager
    def admission(self) -> Iterator[None]:
        """One of the model's `max_queue_size` places, held until the answer; 503 with Retry-After when
        they are all taken. Taken before a request's body is read, so a full model refuses at once."""
        if self._waiting_requests >= self.max_queue_size:
            raise Unavailable(f"model '{self.name}' is overloaded: {self._waiting_requests} requests queued "
                              f"(POSENC_MAX_QUEUE_SIZE={self.max_queue_size}); retry later", retry_after=1,
                              overloaded=True)
        self._set_waiting(self._waiting_requests + 1)
        try:
            yield
        finally:
            self._set_waiting(self._waiting_requests - 1)

    async def submit(self, inputs: Arrays, out: Arrays | None = None) -> dict[str, np.ndarray]:
        """Queue one request (batch-first arrays); 503 with Retry-After when the queue is full.

        `out`: arrays (batch-first, each output's exact shape and dtype) that those outputs are written into and
        returned as; a request that runs alone has onnxruntime write there directly
        (`posenc.service.inference.runtime.engine`)."""
        with self.admission():
            return await self.run_admitted(inputs, out)

    async def run_admitted(self, inputs: Arrays, out: Arrays | None = None) -> dict[str, np.ndarray]:
        """`submit` for a request that already holds its place (`admission`)."""
        chunks = split_rows(inputs, out, self._chunk_rows(inputs, self.max_batch_size))
        if not self.batching:
            return joined([await self._run_alone(chunk, chunk_out, self._shape(chunk))
                           for chunk, chunk_out in chunks], out)
        if len(chunks) == 1:
            chunk, chunk_out = chunks[0]
            shape = self._shape(chunk)
            if self._long_run(*shape):
                # Never batched (`_take_group` takes a long run alone), so it takes batching off's path whatever
                # runs or waits: queued in the worker threads, it starts the moment one is free. Through the
                # dispatcher, each next run would start only once the event loop has seen a run end and taken a
                # slot, a hop per run on a core the runs share (on a 2-vCPU EPYC, 3-10 % more median latency for
                # 16 clients at S=256).
                return await self._run_alone(chunk, chunk_out, shape)
            self._ensure_dispatcher()
            assert self._slots is not None
            if not self._queue and not self._slots.locked() and self._alone(shape):
                # what the dispatcher would do, a batch of one, without its hops (three event-loop iterations)
                await self._slots.acquire()  # a free slot: taken without waiting
                try:
                    return await self._run_alone(chunk, chunk_out, shape)
                finally:
                    self._slots.release()  # what queued meanwhile forms the next batch
        return await self._submit_batched(chunks, out)

    async def _run_alone(self, chunk: Arrays, out: Arrays | None, shape: Shape) -> dict[str, np.ndarray]:
        """One chunk (of `_shape` `shape`) run by itself, on the event loop or a worker thread (`_execute`), without
        the dispatcher."""
        _, rows, seq = shape
        async with self._reserve(rows, seq):
            outputs, seconds = await self._execute(shape, self._run_counted, chunk, 1, out)
        phases.add_run(seconds)
        return outputs

    async def _execute(self, shape: Shape, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` on the event loop when the last run of `shape` took less than the inline bound, else in a
        worker thread."""
        seconds = self.run_times.last(shape)
        if seconds is not None and seconds < self.inline_below:
            self.inline_runs += 1
            return self._timed(shape, fn, *args)
        run = asyncio.get_running_loop().run_in_executor(self.executor, self._timed, shape, fn, *args)
        try:
            return await asyncio.shield(run)
        except asyncio.CancelledError:
            # A thread cannot be stopped: the run goes on, holding its inputs and its scores. Its caller ends once
            # the run has, so what counts the run (its place, the caller's memory reservation) is given back then.
            await _finished(run)
            raise

    def _timed(self, shape: Shape, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)`, remembering how long it took for `shape` (what it would hold the event loop for)."""
        started = time.perf_counter()
        result = fn(*args)
        self.run_times.record(shape, time.perf_counter() - started)
        return result

    def _chunk_rows(self, inputs: Arrays, rows: int) -> int:
        """At most `rows` rows per run, fewer where one run of them would exceed the run budget (at least 1)."""
        if self.run_bytes is None or self.run_budget is None:
            return rows
        seq = self._seq(inputs)
        fitting = self.run_budget.capacity // max(1, self.run_bytes(1, seq))
        return max(1, min(rows, fitting))

    @contextlib.asynccontextmanager
    async def _reserve(self, rows: int, seq: int) -> AsyncIterator[None]:
        """Hold one run's bytes in the run budget while it runs (nothing without a budget)."""
        if self.run_bytes is None or self.run_budget is None:
            yield
            return
        async with self.run_budget.reserve(self.run_bytes(rows, seq), f"a run of '{self.name}'"):
            yield

    def _set_waiting(self, count: int) -> None:
        self._waiting_requests = count
        if self.observer is not None:
            self.observer.set_queue_depth(self.name, count)

    async def _submit_batched(self, chunks: list[tuple[Arrays, Arrays | None]],
                              out: Arrays | None) -> dict[str, np.ndarray]:
        self._ensure_dispatcher()
        loop = asyncio.get_running_loop()
        items = [_Item(chunk, rows_of(chunk), self._seq(chunk), self._key(chunk), loop.create_future(), chunk_out)
                 for chunk, chunk_out in chunks]
        self._queue.extend(items)
        assert self._wake is not None
        self._wake.set()
        if len(items) == 1:
            result = await items[0].future
        else:
            result = joined(await asyncio.gather(*(item.future for item in items)), out)
        phases.add_run(sum(item.run_seconds for item in items))
        return result

    def _ensure_dispatcher(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._slots = asyncio.Semaphore(self.max_runs)
            self._task = asyncio.get_running_loop().create_task(self._dispatch(), name=f"batcher-{self.name}")

    def _shape(self, chunk: Arrays) -> Shape:
        """A chunk's (batch key, rows, sequence length): what its runs are timed by."""
        return self._key(chunk), rows_of(chunk), self._seq(chunk)

    def _seq(self, inputs: Arrays) -> int:
        """The inputs' sequence length (0 when the model has no sequence axis)."""
        for name, axis in (self.seq_axes or {}).items():
            if name in inputs:
                return int(inputs[name].shape[axis])
        return 0

    def _key(self, inputs: Arrays) -> BatchKey:
        """Requests with equal keys can share a batch: shapes without the batch (and padded seq) axis."""
        key = []
        for name in sorted(inputs):
            shape = list(inputs[name].shape[1:])
            if self.pad and self.seq_axes is not None and name in self.seq_axes:
                shape[self.seq_axes[name] - 1] = -1
            key.append((name, inputs[name].dtype.str, tuple(shape)))
        return tuple(key)

    async def _dispatch(self) -> None:
        assert self._wake is not None and self._slots is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._queue:
                continue
            if self.delay > 0:
                await self._fill_window()
            while self._queue:
                await self._slots.acquire()  # a run is free: what queued while waiting for it forms this batch
                if not self._queue:
                    self._slots.release()
                    break
                run = asyncio.get_running_loop().create_task(self._run_slot(self._take_group()))
                self._runs.add(run)
                run.add_done_callback(self._runs.discard)

    async def _run_slot(self, group: list[_Item]) -> None:
        """Run one group in a slot of `max_runs`, freed at the end."""
        assert self._slots is not None
        try:
            await self._run_group(group)
        except Exception as exc:  # never leave a request waiting if the dispatcher itself trips
            log.exception("batcher %s failed on a group", self.name)
            for item in group:
                _settle(item, exc=exc)
        finally:
            self._slots.release()

    async def _fill_window(self) -> None:
        """Wait (at most the queue delay) until a full batch is queued."""
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.delay
        while sum(item.rows for item in self._queue) < self.max_batch_size:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=remaining)
            except TimeoutError:
                return

    def _take_group(self) -> list[_Item]:
        """The oldest item plus the compatible queued items that fit in max_batch_size rows, when a batch of
        them is expected to cost less per row than the oldest item's rows alone (`RunTimes.batch_pays`)."""
        first = self._queue.popleft()
        if self._long_run(first.key, first.rows, first.seq):
            return [first]
        group, rows, longest, valid = [first], first.rows, first.seq, first.rows * first.seq
        for item in self._queue:
            if item.key != first.key or rows + item.rows > self.max_batch_size:
                continue
            new_longest = max(longest, item.seq)
            new_valid = valid + item.rows * item.seq
            if self.pad and new_longest * (rows + item.rows) > MAX_PADDING_RATIO * new_valid:
                continue
            if self._over_budget(rows + item.rows, new_longest):
                continue
            group.append(item)
            rows, longest, valid = rows + item.rows, new_longest, new_valid
        if len(group) == 1:
            return group
        # a request that finds nothing queued and a run free runs at once, without the dispatcher's hops, where its
        # batch was last judged not to pay (`_alone`)
        pays = self.run_times.batch_pays((first.key, first.rows, first.seq), (first.key, rows, longest))
        self.run_times.judge(first.key, first.seq, alone=not pays)
        if not pays:
            return [first]
        taken = {id(item) for item in group}
        self._queue = collections.deque(item for item in self._queue if id(item) not in taken)
        return group

    def _long_run(self, key: BatchKey, rows: int, seq: int) -> bool:
        """Whether these rows take `batch_below_us` or longer to run (at the cost per row of the last run of the
        key and sequence length): a long run has little fixed cost to save, and on a CPU costs more per row in a
        batch."""
        return self.run_times.expected(key, rows, seq) >= self.batch_below

    def _alone(self, shape: Shape) -> bool:
        """Whether a request of this shape (not a long run: those always run alone) that finds nothing queued and
        a run free runs alone without the dispatcher: one whose batch was last judged not to pay (`_take_group`
        judges again whenever some queue), or, under a run-time bound (the CPU), one that runs on the event loop:
        while it holds the loop no other request can queue behind it, so the dispatcher would make it a batch of
        one at the cost of its hops."""
        key, _, seq = shape
        if self.run_times.judged_alone(key, seq):
            return True
        seconds = self.run_times.last(shape)
        return self.batch_below != math.inf and seconds is not None and seconds < self.inline_below

    def _over_budget(self, rows: int, seq: int) -> bool:
        return (self.run_bytes is not None and self.run_budget is not None
                and self.run_bytes(rows, seq) > self.run_budget.capacity)

    async def _run_group(self, group: list[_Item]) -> None:
        live = [item for item in group if not item.future.done()]  # a cancelled request is not run
        if not live:
            return
        try:
            rows, seq = sum(item.rows for item in live), max(item.seq for item in live)
            async with self._reserve(rows, seq):
                outputs = await self._execute((live[0].key, rows, seq), self._run_batch, live)
        except Exception as exc:
            if len(live) == 1:
                _settle(live[0], exc=exc)
                return
            log.warning("batch of %d requests on %s failed (%s); retrying them one by one", len(live), self.name, exc)
            for item in live:
                await self._run_group([item])
            return
        for item, result in zip(live, outputs, strict=True):
            _settle(item, result=result)

    def _run_counted(self, inputs: Arrays, requests: int = 1,
                     out: Arrays | None = None) -> tuple[dict[str, np.ndarray], float]:
        """One model run over `requests` requests' rows (worker thread), into `out` where given; with its seconds."""
        started = time.perf_counter()
        outputs = self.run(inputs, out) if out else self.run(inputs)
        seconds = time.perf_counter() - started
        with self._stats_lock:
            self.inference_count += rows_of(inputs)
            self.execution_count += 1
        if self.observer is not None:
            self.observer.observe_run(self.name, seconds)
            self.observer.observe_batch(self.name, requests)
        return outputs, seconds

    def _run_batch(self, items: list[_Item]) -> list[dict[str, np.ndarray]]:
        """Worker thread: concatenate (right-padding sequences), run once, split per item."""
        if len(items) == 1:
            outputs, items[0].run_seconds = self._run_counted(items[0].inputs, out=items[0].out)
            return [outputs]
        inputs, seqs = [item.inputs for item in items], [item.seq for item in items]
        seq_axes = self.seq_axes if self.pad else None
        longest = max(seqs)
        batched = {name: stack(inputs, seqs, longest, name, (seq_axes or {}).get(name))  # [sum(rows), ...]
                   for name in items[0].inputs}
        outputs, seconds = self._run_counted(batched, requests=len(items))
        for item in items:
            item.run_seconds = seconds
        return unstack(outputs, [item.rows for item in items], seqs, [item.out for item in items], seq_axes)

    async def close(self) -> None:
        """Stop the dispatcher; queued requests get 503."""
        tasks = [task for task in (self._task, *self._runs) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        while self._queue:
            _settle(self._queue.popleft(), exc=Unavailable("the service is shutting down", retry_after=1))


def _settle(item: _Item, *, result: dict[str, np.ndarray] | None = None, exc: BaseException | None = None) -> None:
    if item.future.done():
        return
    if exc is not None:
        item.future.set_exception(exc)
    else:
        assert result is not None
        item.future.set_result(result)


async def _finished(run: asyncio.Future[Any]) -> None:
    """Wait until `run` is done, whatever it ends with, through any further cancellation of the waiting task."""
    while not run.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({run})
    if not run.cancelled():
        run.exception()  # retrieved: the caller was cancelled, nobody else reads it
