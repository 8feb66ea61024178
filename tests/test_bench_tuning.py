"""bench.tuning's report of the cost model: held-out accuracy and the repeatability of the timings it is scored on."""

from __future__ import annotations

from bench.tuning import held_out_accuracy
from compiler.costs.records import JSONLinesDatabase
from compiler.search.task_scheduler import TaskScheduler, TuneOptions
from compiler.targets.cpu.runner import LocalBuilder, LocalRunner
from tests.test_tune import PARAMS, TASK


def test_held_out_accuracy_times_the_test_programs_again(tmp_path):
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    options = TuneOptions(trials=48, measures_per_round=16, params=PARAMS, seed=0, retime_best=0)
    with LocalBuilder() as builder, LocalRunner(repeat=1, min_repeat_ms=5, threads=1) as runner:
        TaskScheduler([TASK], db, options, builder=builder, runner=runner).run()
    records = [r for r in db if r.ok]
    assert len(records) > 40
    acc = held_out_accuracy(TASK, records, first=24)
    assert acc is not None and "repeatability" not in acc  # no second timing unless asked for
    acc = held_out_accuracy(TASK, records, first=24, retime_threads=1)
    for key in ("random", "later", "regression_random", "regression_later", "repeatability", "timing_vs_truth",
                "random_two_timings"):
        assert 0.0 <= acc[key] <= 1.0, key
    r, q = acc["repeatability"], acc["timing_vs_truth"]
    assert r > 0.6  # two timings of matmul64's programs mostly agree (0.88 when written)
    assert q >= r and abs(q * q + (1 - q) ** 2 - r) < 0.01  # two timings that each agree with the truth q of the time
    assert held_out_accuracy(TASK, records[:30], first=24) is None  # too few to hold any out
