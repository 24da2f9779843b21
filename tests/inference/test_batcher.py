"""The per-model micro-batcher: grouping, splitting, padding, isolation, queue limit; batched == unbatched."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from posenc.service.errors import Unavailable
from posenc.service.inference.runtime.batcher import Batcher
from posenc.service.inference.runtime.engine import Engine, run_model
from posenc.service.inference.runtime.repository import LoadedModel
from posenc.service.settings import Settings
from tests.onnx_models import REPOSITORY, SHIPPED, random_inputs


class Recorder:
    """A fake model: output = x + 1 with x [B, S, 2]; records every batch shape; fails on NaN rows."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.shapes: list[tuple[int, ...]] = []
        self.gate = gate

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.gate is not None:
            self.gate.wait(10)
        x = inputs["x"]
        self.shapes.append(x.shape)
        if np.isnan(x).any():
            raise ValueError("NaN in batch")
        return {"output": x + 1}


def _batcher(run: Recorder, *, causal: bool = False, max_batch_size: int = 8, delay_us: int = 20_000,
             queue: int = 64, batching: bool = True) -> Batcher:
    return Batcher(run, ThreadPoolExecutor(2), max_batch_size=max_batch_size, max_queue_delay_us=delay_us,
                   max_queue_size=queue, batching=batching,
                   seq_axes={"x": 1, "output": 1} if causal else None, pad=causal)


def _request(rows: int, seq: int, value: float) -> dict[str, np.ndarray]:
    return {"x": np.full((rows, seq, 2), value, dtype=np.float32) + np.arange(seq, dtype=np.float32)[:, None]}


async def _submit_all(batcher: Batcher, requests: list[dict[str, np.ndarray]]) -> list:
    results = await asyncio.gather(*(batcher.submit(r) for r in requests), return_exceptions=True)
    await batcher.close()
    return results


@pytest.mark.parametrize("causal", [False, True])
def test_each_request_gets_exactly_its_rows(causal: bool) -> None:
    run = Recorder()
    requests = [_request(rows, seq, float(i * 100)) for i, (rows, seq) in
                enumerate([(1, 3), (2, 3), (1, 5), (3, 3), (1, 4), (2, 5)])]
    results = asyncio.run(_submit_all(_batcher(run, causal=causal), requests))
    for request, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result["output"], request["x"] + 1)
    assert len(run.shapes) < len(requests)  # they were batched
    assert all(shape[0] <= 8 for shape in run.shapes)
    if causal:  # right-padded to the longest sequence; 10 rows > max_batch_size 8 → two batches, in order
        assert run.shapes == [(8, 5, 2), (2, 5, 2)]
    else:  # grouped by exact sequence length: 3 → 6 rows, 5 → 3 rows, 4 → 1 row
        assert sorted(run.shapes) == [(1, 4, 2), (3, 5, 2), (6, 3, 2)]


def test_padding_is_bounded() -> None:
    run = Recorder()
    requests = [_request(2, 1, 0.0), _request(1, 40, 1.0), _request(1, 38, 2.0)]
    results = asyncio.run(_submit_all(_batcher(run, causal=True), requests))
    for request, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result["output"], request["x"] + 1)
    assert sorted(run.shapes) == [(2, 1, 2), (2, 40, 2)]  # padding 1 → 40 would more than double the work


def test_requests_larger_than_max_batch_size_are_split() -> None:
    run = Recorder()
    requests = [_request(10, 2, 1.0), _request(3, 2, 50.0)]
    results = asyncio.run(_submit_all(_batcher(run, max_batch_size=4), requests))
    for request, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result["output"], request["x"] + 1)
    assert all(shape[0] <= 4 for shape in run.shapes) and sum(s[0] for s in run.shapes) == 13


def test_a_failing_request_does_not_fail_its_neighbours() -> None:
    run = Recorder()
    bad = _request(1, 3, 0.0)
    bad["x"][0, 0, 0] = np.nan
    requests = [_request(1, 3, 1.0), bad, _request(2, 3, 2.0)]
    results = asyncio.run(_submit_all(_batcher(run), requests))
    np.testing.assert_array_equal(results[0]["output"], requests[0]["x"] + 1)
    assert isinstance(results[1], ValueError)
    np.testing.assert_array_equal(results[2]["output"], requests[2]["x"] + 1)


def test_full_queue_is_503_with_retry_after() -> None:
    gate = threading.Event()
    run = Recorder(gate)

    async def scenario() -> list:
        batcher = _batcher(run, queue=2, delay_us=0)
        first = [asyncio.ensure_future(batcher.submit(_request(1, 2, float(i)))) for i in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(Unavailable) as info:
            await batcher.submit(_request(1, 2, 9.0))
        assert info.value.headers["Retry-After"] == "1" and "POSENC_MAX_QUEUE_SIZE=2" in info.value.message
        gate.set()
        results = await asyncio.gather(*first)
        await batcher.close()
        return results

    results = asyncio.run(scenario())
    assert [float(r["output"][0, 0, 0]) for r in results] == [1.0, 2.0]


class Started(Recorder):
    """A Recorder that says when its first run has begun, and holds every run until `gate` opens."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__(gate)
        self.started = threading.Event()

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.started.set()
        return super().__call__(inputs)


@pytest.mark.parametrize("causal", [False, True])
def test_by_default_a_lone_request_runs_at_once_and_waiting_ones_batch(
    causal: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default never waits for neighbours (no delay window at all); the requests that queue behind a run form the
    next batch together (right-padded for a causal model)."""
    gate = threading.Event()
    run = Started(gate)

    windows: list[Batcher] = []

    async def window(self: Batcher) -> None:  # the batcher would wait here for a fuller batch
        windows.append(self)

    monkeypatch.setattr(Batcher, "_fill_window", window)

    async def scenario() -> list:
        batcher = _batcher(run, causal=causal, delay_us=Settings().max_queue_delay_us)
        first = asyncio.ensure_future(batcher.submit(_request(1, 3, 0.0)))
        await asyncio.to_thread(run.started.wait, 10)  # the lone request is running, with nobody else queued
        later = [asyncio.ensure_future(batcher.submit(_request(1, 2 if i == 1 else 3, float(i)))) for i in range(1, 4)]
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(first, *later)
        await batcher.close()
        return results

    results = asyncio.run(scenario())
    assert windows == []
    # causal: padded to the longest sequence; otherwise sequences of 2 and 3 are separate groups (oldest first)
    expected = [(1, 3, 2), (3, 3, 2)] if causal else [(1, 3, 2), (1, 2, 2), (2, 3, 2)]
    assert run.shapes == expected
    assert results[1]["output"].shape == (1, 2, 2)  # padded positions dropped again
    np.testing.assert_array_equal(results[1]["output"], _request(1, 2, 1.0)["x"] + 1)


def test_batching_off_runs_each_request_alone() -> None:
    run = Recorder()
    requests = [_request(1, 3, float(i)) for i in range(4)]
    results = asyncio.run(_submit_all(_batcher(run, batching=False), requests))
    assert sorted(run.shapes) == [(1, 3, 2)] * 4
    for request, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result["output"], request["x"] + 1)


@pytest.mark.parametrize("model", SHIPPED)
def test_batched_equals_unbatched_on_the_shipped_models(model: str) -> None:
    engine = Engine(Settings(model_repository=REPOSITORY, max_queue_delay_us=20_000, intra_op_num_threads=1))
    assert engine.load() == []
    entry = engine.models[model]
    assert isinstance(entry, LoadedModel)
    hq, hkv, dim = (entry.config.raw["attention"][k] for k in ("num_heads", "num_kv_heads", "head_dim"))
    shapes = [(1, 4), (2, 4), (1, 7), (3, 2), (1, 1), (9, 3), (2, 6)]  # 9 rows > max_batch_size 8: split
    # longrope switches frequencies per row at switch_position: odd requests end just below, on or past it,
    # so a run mixes rows of both sets
    switch = entry.config.raw["rope"].get("switch_position")
    starts = [17 * i if switch is None or i % 2 == 0 else switch - s + i % 3 for i, (_, s) in enumerate(shapes)]
    requests = [random_inputs(hq, hkv, dim, b, s, seed=i, start=start)
                for i, ((b, s), start) in enumerate(zip(shapes, starts, strict=True))]

    async def scenario() -> list:
        results = await asyncio.gather(*(engine.infer(entry, r) for r in requests))
        await engine.close()
        return results

    results = asyncio.run(scenario())
    assert engine.batchers[model].execution_count < len(requests)
    for request, result in zip(requests, results, strict=True):
        alone = run_model(entry, request)["output"]
        assert result["output"].shape == alone.shape
        np.testing.assert_allclose(result["output"], alone, atol=1e-5, rtol=1e-5)


class InPlace(Recorder):
    """The fake model, writing its output into `out` when given (as `run_model` does on CPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.given_out: list[bool] = []

    def __call__(self, inputs: Mapping[str, np.ndarray],
                 out: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        result = super().__call__(inputs)
        self.given_out.append(out is not None)
        if out is not None:
            np.copyto(out["output"], result["output"])
            result["output"] = out["output"]
        return result


@pytest.mark.parametrize(("case", "shapes", "in_place"), [
    ("alone", [(3, 4)], [True]),
    ("split into chunks", [(5, 4)], [True, True]),  # max_batch_size 3: rows 0-2 and 3-4, each into its own rows
    ("batched with others", [(1, 4), (1, 4), (1, 3)], None),
    ("batching off", [(5, 4)], [True, True]),
])
def test_outputs_land_in_the_callers_arrays(case: str, shapes: list[tuple[int, int]],
                                            in_place: list[bool] | None) -> None:
    """`out` arrays are filled and returned as the outputs, whether the request ran alone (the model writes
    into them), in chunks (each into its rows) or inside a batch with others (copied in)."""
    run = InPlace()
    requests = [_request(rows, seq, float(10 * i)) for i, (rows, seq) in enumerate(shapes)]
    outs = [{"output": np.full(r["x"].shape, np.nan, np.float32)} for r in requests]

    async def main() -> list[dict[str, np.ndarray]]:
        batcher = _batcher(run, causal=True, max_batch_size=3, delay_us=20_000 if case.startswith("batched") else 0,
                           batching=case != "batching off")
        results = await asyncio.gather(*(batcher.submit(r, o) for r, o in zip(requests, outs, strict=True)))
        await batcher.close()
        return results

    results = asyncio.run(main())
    for request, out, result in zip(requests, outs, results, strict=True):
        assert result["output"] is out["output"]
        np.testing.assert_array_equal(out["output"], request["x"] + 1)
    if in_place is not None:
        assert run.given_out == in_place
    else:
        assert len(run.shapes) == 1 and run.given_out == [False]  # one padded batch, then copied into each `out`


class ThreadRecorder(Recorder):
    """A Recorder that notes the thread of every run and takes `seconds` per run."""

    def __init__(self, seconds: float = 0.0) -> None:
        super().__init__()
        self.seconds = seconds
        self.threads: list[threading.Thread] = []

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread())
        if self.seconds:
            threading.Event().wait(self.seconds)
        return super().__call__(inputs)


@pytest.mark.parametrize("batching", [True, False])
def test_a_shape_whose_last_run_was_short_runs_on_the_event_loop(batching: bool) -> None:
    """No thread hop for a run known to be short: the first run of a shape goes to a worker thread (its time is
    unknown), the next ones of that shape run on the loop; another shape starts in a worker thread again."""
    run = ThreadRecorder()
    batcher = Batcher(run, ThreadPoolExecutor(2), max_batch_size=8, max_queue_delay_us=0, max_queue_size=64,
                      batching=batching, inline_run_us=1_000_000)

    async def scenario() -> threading.Thread:
        for rows, seq in [(1, 3), (1, 3), (1, 3), (2, 3), (2, 3)]:
            result = await batcher.submit(_request(rows, seq, 1.0))
            np.testing.assert_array_equal(result["output"], _request(rows, seq, 1.0)["x"] + 1)
        await batcher.close()
        return threading.current_thread()

    loop_thread = asyncio.run(scenario())
    assert [thread is loop_thread for thread in run.threads] == [False, True, True, False, True]
    assert batcher.inline_runs == 3
    assert batcher.execution_count == 5


def test_a_long_run_and_the_default_off_take_a_worker_thread() -> None:
    """A shape whose last run took longer than the bound keeps going to a worker thread; a bound of 0 never
    runs on the loop."""
    for seconds, bound_us in [(0.02, 5_000), (0.0, 0)]:
        run = ThreadRecorder(seconds)
        batcher = Batcher(run, ThreadPoolExecutor(2), max_batch_size=8, max_queue_delay_us=0, max_queue_size=64,
                          inline_run_us=bound_us)

        async def scenario(batcher: Batcher = batcher) -> threading.Thread:
            for _ in range(3):
                await batcher.submit(_request(1, 3, 1.0))
            await batcher.close()
            return threading.current_thread()

        loop_thread = asyncio.run(scenario())
        assert not any(thread is loop_thread for thread in run.threads)
        assert batcher.inline_runs == 0


def test_the_engine_runs_a_short_repeated_request_on_the_event_loop() -> None:
    """The shipped model at B=1, S=16: after the first run, no thread hop (counted)."""
    engine = Engine(Settings(model_repository=REPOSITORY, inline_run_us=1_000_000))

    async def scenario() -> int:
        assert engine.load() == []
        model = engine.models["rope_attention"]
        assert isinstance(model, LoadedModel)
        inputs = random_inputs(8, 8, 64, 1, 16)
        expected = run_model(model, inputs)["output"]
        for _ in range(3):
            np.testing.assert_allclose((await engine.infer(model, inputs))["output"], expected, rtol=1e-6)
        await engine.close()
        return engine.batchers["rope_attention"].inline_runs

    assert asyncio.run(scenario()) == 2


def test_the_run_times_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new shape is remembered; past MAX_SHAPES_TIMED the oldest is forgotten (a client cannot grow it)."""
    monkeypatch.setattr("posenc.service.inference.runtime.run_times.MAX_SHAPES_TIMED", 2)
    batcher = Batcher(ThreadRecorder(), ThreadPoolExecutor(2), max_batch_size=8, max_queue_delay_us=0,
                      max_queue_size=64, inline_run_us=1_000_000)

    async def scenario() -> None:
        for seq in (1, 2, 3, 3):
            await batcher.submit(_request(1, seq, 1.0))
        await batcher.close()

    asyncio.run(scenario())
    assert [key[0][2] for key, _, _ in batcher.run_times.shapes()] == [(2, 2), (3, 2)]  # x without its batch axis
    assert batcher.inline_runs == 1


@pytest.mark.parametrize("max_runs", [1, 2])
def test_up_to_max_runs_batches_run_at_once(max_runs: int) -> None:
    """Batching never serialises what batching off would overlap: with `max_runs` runs free, that many requests
    run at once (counted while every run is held), and only what queues behind them is batched."""
    gate = threading.Event()
    run = Recorder(gate)
    batcher = Batcher(run, ThreadPoolExecutor(4), max_batch_size=8, max_queue_delay_us=0, max_queue_size=64,
                      max_runs=max_runs)

    async def scenario() -> int:
        tasks = []
        for i in range(4):
            tasks.append(asyncio.ensure_future(batcher.submit(_request(1, 3, float(i)))))
            await asyncio.sleep(0.02)  # one at a time: each finds the runs as the previous ones left them
        in_flight = len(batcher._runs)
        gate.set()
        await asyncio.gather(*tasks)
        await batcher.close()
        return in_flight

    assert asyncio.run(scenario()) == max_runs
    # the first max_runs requests ran alone, the rest queued behind them and ran as one batch
    assert sorted(run.shapes) == sorted([(1, 3, 2)] * max_runs + [(4 - max_runs, 3, 2)])


class Slow(Recorder):
    """The fake model, taking `seconds_per_row` for every row of a run."""

    def __init__(self, seconds_per_row: float) -> None:
        super().__init__()
        self.seconds_per_row = seconds_per_row

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.seconds_per_row * inputs["x"].shape[0])
        return super().__call__(inputs)


@pytest.mark.parametrize(("seconds_per_row", "batch_below_us", "batches"), [
    (0.0005, 1500, True),  # short runs: batches save their fixed cost
    (0.003, 1500, False),  # long runs (rope_attention S=256 on a CPU): requests run one by one
    (0.003, 0, True),  # no bound (a GPU): batches whatever the run time
])
def test_requests_whose_runs_are_long_run_one_by_one(seconds_per_row: float, batch_below_us: int,
                                                     batches: bool) -> None:
    """Waves of 4 concurrent single-row requests, one run at a time: after the first wave (which batches,
    nothing being measured yet), runs of long rows take one request each."""
    run = Slow(seconds_per_row)
    batcher = Batcher(run, ThreadPoolExecutor(2), max_batch_size=8, max_queue_delay_us=0, max_queue_size=64,
                      batch_below_us=batch_below_us)

    async def scenario() -> None:
        for wave in range(6):
            await asyncio.gather(*(batcher.submit(_request(1, 3, float(wave))) for _ in range(4)))
        await batcher.close()

    asyncio.run(scenario())
    rows = [shape[0] for shape in run.shapes]
    assert sum(rows) == 6 * 4
    later = rows[-12:]  # the last waves
    assert (max(later) > 1) is batches, rows


def test_long_runs_queue_in_the_worker_threads_not_the_dispatcher() -> None:
    """A long run is never batched, so it takes batching off's path even while every run slot is taken: queued in
    the worker threads, it starts as soon as one is free, instead of waiting for the event loop to see the last
    run end and the dispatcher to hand it a slot. Every request still gets its own rows."""
    run = Slow(0.003)
    batcher = Batcher(run, ThreadPoolExecutor(1), max_batch_size=8, max_queue_delay_us=0, max_queue_size=64,
                      batch_below_us=1500, max_runs=1)

    async def scenario() -> int:
        await batcher.submit(_request(1, 3, 0.0))  # its run time is what makes the next ones long
        groups = _groups_taken(batcher)
        for wave in range(3):
            requests = [_request(1, 3, float(10 * wave + i)) for i in range(4)]
            results = await asyncio.gather(*(batcher.submit(request) for request in requests))
            for request, result in zip(requests, results, strict=True):
                np.testing.assert_array_equal(result["output"], request["x"] + 1)
        await batcher.close()
        return len(groups)

    assert asyncio.run(scenario()) == 0
    assert [shape[0] for shape in run.shapes] == [1] * 13


class Costly(Recorder):
    """The fake model, taking `fixed` seconds per run plus `per_row` per row, times `batched` in a run of more
    than one row (joining and splitting a batch, or kernels slower on larger inputs)."""

    def __init__(self, fixed: float, per_row: float, batched: float) -> None:
        super().__init__()
        self.fixed, self.per_row, self.batched = fixed, per_row, batched

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = inputs["x"].shape[0]
        time.sleep((self.fixed + self.per_row * rows) * (self.batched if rows > 1 else 1.0))
        return super().__call__(inputs)


def _groups_taken(batcher: Batcher) -> list[list]:
    """The groups the batcher's dispatcher takes from now on (the requests that go through it), in order."""
    groups: list[list] = []
    take_group = batcher._take_group

    def counted() -> list:
        groups.append(take_group())
        return groups[-1]

    batcher._take_group = counted  # type: ignore[method-assign]
    return groups


def test_the_chunks_of_long_requests_are_never_batched() -> None:
    """Requests larger than max_batch_size are split into chunks that queue through the dispatcher; where their
    rows are long runs, each chunk runs alone, even where a batch of them would cost less per row."""
    run = Costly(fixed=0.004, per_row=0.0005, batched=1.0)  # a batch shares the fixed cost: it would pay
    batcher = Batcher(run, ThreadPoolExecutor(1), max_batch_size=2, max_queue_delay_us=0, max_queue_size=64,
                      batch_below_us=1500, max_runs=1)

    async def scenario() -> None:
        await batcher.submit(_request(1, 3, 0.0))  # 4.5 ms for one row: from now on every run is long
        requests = [_request(3, 3, 1.0), _request(3, 3, 2.0)]  # chunks of 2 and 1 rows each
        results = await asyncio.gather(*(batcher.submit(request) for request in requests))
        for request, result in zip(requests, results, strict=True):
            np.testing.assert_array_equal(result["output"], request["x"] + 1)
        await batcher.close()

    asyncio.run(scenario())
    assert [shape[0] for shape in run.shapes] == [1, 2, 1, 2, 1]  # never the two single-row chunks together


@pytest.mark.parametrize(("fixed", "per_row", "batched", "batches"), [
    (0.004, 0.0005, 1.0, True),  # a fixed cost per run that a batch shares: batches pay
    (0.0, 0.002, 1.25, False),  # no fixed cost, and a batch costs more per row (the copies, larger kernels)
    (0.0005, 0.001, 1.5, False),  # a fixed cost, but less than the batch adds
])
def test_requests_batch_only_where_a_batch_has_cost_less_per_row(fixed: float, per_row: float, batched: float,
                                                                 batches: bool) -> None:
    """Waves of one request alone, then 4 at once, with no run-time bound: once a shape has run both alone and
    in a batch of each size, later requests batch only if the fastest batch cost less per row than the
    fastest run alone. A lone request of a shape judged to run alone skips the dispatcher."""
    run = Costly(fixed, per_row, batched)
    batcher = Batcher(run, ThreadPoolExecutor(2), max_batch_size=8, max_queue_delay_us=0, max_queue_size=64)
    groups = _groups_taken(batcher)

    async def scenario() -> int:
        for wave in range(8):
            await batcher.submit(_request(1, 3, float(wave)))
            await asyncio.gather(*(batcher.submit(_request(1, 3, float(wave))) for _ in range(4)))
        before = len(groups)
        for _ in range(3):
            await batcher.submit(_request(1, 3, 0.0))
        await batcher.close()
        return len(groups) - before

    lone_through_dispatcher = asyncio.run(scenario())
    rows = [shape[0] for shape in run.shapes]
    assert sum(rows) == 8 * 5 + 3
    later = rows[-18:-3]  # the last three waves
    assert (max(later) > 1) is batches, rows
    assert lone_through_dispatcher == (3 if batches else 0)


@pytest.mark.parametrize(("batch_below_us", "through_dispatcher"), [(1500, 1), (0, 5)])
def test_on_the_cpu_a_lone_short_request_runs_on_the_loop_without_the_dispatcher(batch_below_us: int,
                                                                                 through_dispatcher: int) -> None:
    """Under a run-time bound (the CPU), a lone request whose run is made on the event loop skips the dispatcher
    once its shape has run (nothing can queue behind a run that holds the loop); without one (a GPU) every
    request goes through it, so that requests read together still batch."""
    batcher = Batcher(Recorder(), ThreadPoolExecutor(2), max_batch_size=8, max_queue_delay_us=0, max_queue_size=64,
                      inline_run_us=1_000_000, batch_below_us=batch_below_us)
    groups = _groups_taken(batcher)

    async def scenario() -> None:
        for i in range(5):
            result = await batcher.submit(_request(1, 3, float(i)))
            np.testing.assert_array_equal(result["output"], _request(1, 3, float(i))["x"] + 1)
        await batcher.close()

    asyncio.run(scenario())
    assert len(groups) == through_dispatcher


def test_a_model_on_a_gpu_batches_whatever_its_run_time() -> None:
    engine = Engine(Settings(model_repository=REPOSITORY, intra_op_num_threads=1, batch_below_us=1500))
    assert engine.load() == []
    entry = engine.models["rope_attention"]
    assert isinstance(entry, LoadedModel)
    assert engine.batchers["rope_attention"].batch_below == 0.0015
    on_gpu = dataclasses.replace(entry, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert engine._batcher(on_gpu).batch_below == float("inf")
