"""The batcher's memory of run times (`posenc.service.inference.runtime.run_times`): what it expects, how it judges a
batch, and that no memory grows past its bound."""

from __future__ import annotations

import threading

import pytest

from posenc.service.inference.runtime.run_times import RunTimes, Shape

KEY = (("x", "<f4", (4,)),)
OTHER = (("x", "<f4", (8,)),)


def test_the_last_run_and_the_expected_time_of_more_rows() -> None:
    times = RunTimes()
    assert times.last((KEY, 2, 16)) is None
    assert times.expected(KEY, 4, 16) == 0.0  # nothing run yet: no run is known to be long
    times.record((KEY, 2, 16), 0.010)
    times.record((KEY, 2, 16), 0.004)
    assert times.last((KEY, 2, 16)) == 0.004  # the last, not the fastest
    assert times.expected(KEY, 4, 16) == pytest.approx(0.008)  # 2 ms per row, whatever rows the run had
    assert times.expected(KEY, 4, 32) == 0.0 and times.expected(OTHER, 4, 16) == 0.0  # per key and length
    times.record((KEY, 8, 16), 0.008)
    assert times.expected(KEY, 4, 16) == pytest.approx(0.004)  # the last run's cost per row


@pytest.mark.parametrize(("alone_runs", "batch_runs", "pays"), [
    ([], [], True),  # nothing known: batch
    ([0.002], [], True),
    ([], [0.020], True),
    ([0.002], [0.020], False),  # 2.5 ms per row batched against 2 alone
    ([0.002], [0.012], True),  # 1.5 ms per row batched
    ([0.009, 0.002], [0.020, 0.012], True),  # the fastest of each is what counts
    ([0.002, 0.009], [0.012, 0.030], True),
    ([0.002, 0.009], [0.020], False),  # not the last run alone (9 ms) but the fastest (2 ms)
    ([0.009], [0.012, 0.080], True),  # not the last batch (10 ms per row) but the fastest (1.5)
])
def test_a_batch_pays_where_its_fastest_run_costs_less_per_row(alone_runs: list[float], batch_runs: list[float],
                                                               pays: bool) -> None:
    times = RunTimes()
    alone, batch = (KEY, 1, 16), (KEY, 8, 16)
    for seconds in alone_runs:
        times.record(alone, seconds)
    for seconds in batch_runs:
        times.record(batch, seconds)
    assert times.batch_pays(alone, batch) is pays


def test_the_judgement_is_the_last_one() -> None:
    times = RunTimes()
    assert not times.judged_alone(KEY, 16)
    times.judge(KEY, 16, alone=True)
    assert times.judged_alone(KEY, 16) and not times.judged_alone(KEY, 32) and not times.judged_alone(OTHER, 16)
    times.judge(KEY, 16, alone=False)
    assert not times.judged_alone(KEY, 16)


def test_every_memory_keeps_at_most_the_bound_forgetting_the_oldest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("posenc.service.inference.runtime.run_times.MAX_SHAPES_TIMED", 3)
    times = RunTimes()
    shapes: list[Shape] = [(KEY, 1, seq) for seq in range(10)]
    for shape in shapes:
        times.record(shape, 0.001)
        times.judge(KEY, shape[2], alone=True)
    assert times.shapes() == shapes[-3:]
    assert times.last(shapes[0]) is None and times.expected(KEY, 1, 0) == 0.0 and not times.judged_alone(KEY, 0)
    assert times.batch_pays(shapes[0], (KEY, 2, 0))  # its fastest run is forgotten too
    assert all(len(memory) == 3 for memory in vars(times).values() if isinstance(memory, dict))


def test_runs_recorded_from_many_threads_keep_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("posenc.service.inference.runtime.run_times.MAX_SHAPES_TIMED", 16)
    times = RunTimes()

    def record(first: int) -> None:
        for seq in range(first, first + 500):
            times.record((KEY, 1, seq), 0.001)

    threads = [threading.Thread(target=record, args=(1000 * i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(times.shapes()) == 16
