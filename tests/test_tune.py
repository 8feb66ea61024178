"""Tuning end to end with the real builder and runner on a 64^3 matmul: records with traces land in the database,
every valid record computes the right answer, injected bad kernels become error codes without stopping the run,
and a resumed run never measures a program twice."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from compiler.artifact.in_model import ModelTiming
from compiler.costs.cost_model import RandomModel, XGBModel
from compiler.costs.measure import (
    BUILD_TIMEOUT,
    RUN,
    RUN_TIMEOUT,
    WRONG_ANSWER,
    BuildResult,
    MeasureInput,
    MeasureResult,
)
from compiler.costs.records import (
    COLD_WEIGHTS,
    IN_MODEL,
    WARM,
    JSONLinesDatabase,
    as_tuples,
    best_replaying,
    judged_in_model,
    target_name,
)
from compiler.schedule.lower import lower
from compiler.schedule.state import apply_steps, program_key, step_from_record
from compiler.search.evolution import SearchParams
from compiler.search.task_scheduler import (
    FINAL_TIMING_ROUNDS,
    RETIME_CHALLENGERS,
    RETIME_MAX_CHALLENGERS,
    RETIME_PASSES,
    RETIME_ROUNDS,
    TaskScheduler,
    TuneOptions,
)
from compiler.targets import host_target
from compiler.targets.cpu.codegen import compile_funcs
from compiler.targets.cpu.default_schedule import default_schedule
from compiler.targets.cpu.runner import LocalBuilder, LocalRunner
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task
from tests.test_measure import c_library

N = 64
A = te.placeholder((N, N), name="A")
B = te.placeholder((N, N), name="B")
DAG = ComputeDAG([A, B, ops.matmul(A, B, name="C")])
TASK = Task(DAG.workload_key, DAG, "matmul64")
PARAMS = SearchParams(population=32, num_iters=1, init_min_population=16)
TRIALS, PER_ROUND, MORE_TRIALS = 24, 8, 16


class InstantBuilder:
    """A builder that answers at once with no library (for runners that need none)."""

    def build(self, inputs):
        return [BuildResult(None, None, "", 0.0) for _ in inputs]


# position in the first batch (0 is the default schedule) -> a kernel with the candidates' ABI, and its error code
FAULTS = {
    1: ({"before": "*(volatile int*)0 = 0;"}, RUN),
    2: ({"before": 'for (;;) { __asm__ volatile(""); }'}, RUN_TIMEOUT),
    3: ({"scale": "1.01f"}, WRONG_ANSWER),
}


def key_of(inp: MeasureInput) -> str:
    return json.dumps([s.record() for s in inp.steps], separators=(",", ":"))


class FirstThenLater:
    """A runner for a shared host's timings: the first batch's n-th program takes first(n) seconds, and every later
    timing of it later(n). Remembers the program keys of each later batch (`batches`), in the order timed."""

    cache = WARM

    def __init__(self, first, later):
        self.first, self.later = first, later
        self.calls, self.position, self.batches = 0, {}, []

    def run(self, inputs, builds):
        self.calls += 1
        keys = [key_of(inp) for inp in inputs]
        if self.calls == 1:
            self.position = {k: n for n, k in enumerate(keys)}
            return [MeasureResult((self.first(n),), None, "", 0.0, 0.0) for n in range(len(keys))]
        self.batches.append(keys)
        return [MeasureResult((self.later(self.position[k]),), None, "", 0.0, 0.0) for k in keys]


class FaultyBuilder:
    """The real builder, except that chosen candidates of the first batch get a C library that crashes, hangs or
    computes wrong values. Remembers the program key of everything it was asked to build."""

    def __init__(self, inner: LocalBuilder, workdir: Path, faults: dict):
        self.inner, self.workdir, self.faults = inner, workdir, faults
        self.batches: list[list[str]] = []

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        results = self.inner.build(inputs)
        if not self.batches:
            for i, (kwargs, _) in self.faults.items():
                if results[i].path:  # the scheduler deletes only the libraries it is given
                    Path(results[i].path).unlink()
                results[i] = BuildResult(c_library(self.workdir, f"fault{i}", **kwargs), None, "", 0.0)
        self.batches.append([key_of(inp) for inp in inputs])
        return results


@pytest.fixture(scope="module")
def builder():
    # A program whose reduction nest is unrolled 512 steps around a vector loop is 10-30k lines of LLVM IR, which
    # LLVM's O3 pipeline takes 20 s to minutes to optimize: such a build is a build_timeout, which is a result like
    # any other. 5 s instead of 15 keeps this test's time bounded; a 64^3 matmul builds in well under a second.
    with LocalBuilder(n_parallel=2, timeout=5.0) as b:
        yield b


@pytest.fixture(scope="module")
def runner():
    with LocalRunner(timeout=2.0, repeat=1, min_repeat_ms=5, threads=1) as r:
        yield r


@pytest.fixture(scope="module")
def tuned(builder, runner, tmp_path_factory):
    """One tuning run of TRIALS trials with the faults injected; its records file is what the tests read."""
    tmp = tmp_path_factory.mktemp("tune")
    db = JSONLinesDatabase(tmp / "records.jsonl")
    faulty = FaultyBuilder(builder, tmp, FAULTS)
    rounds = []
    options = TuneOptions(trials=TRIALS, measures_per_round=PER_ROUND, params=PARAMS, seed=0)
    sched = TaskScheduler(
        [TASK],
        db,
        options,
        model=XGBModel(seed=0, num_warmup=8),  # trained from the second round on
        builder=faulty,
        runner=runner,
        callback=lambda s: rounds.append(s.stats.trials),
    )
    sched.run()
    return sched, db, faulty, rounds


def test_records_land_in_the_database_with_traces(tuned):
    sched, db, faulty, rounds = tuned
    records = list(db)
    assert len(records) == TRIALS == sched.stats.trials == sched.progress[0].trials
    assert rounds == [8, 16, 24]
    assert len({r.identity for r in records}) == TRIALS
    assert [r.to_json() for r in JSONLinesDatabase(db.path)] == [r.to_json() for r in records]  # on disk, in order
    assert all(r.workload_key == TASK.key for r in records)
    # the first round measures the default schedule first; it was not made by the search, so it has no trace
    default = records[0]
    assert json.dumps(default.steps, separators=(",", ":")) == program_key(default_schedule(DAG))
    assert default.trace is None and default.ok
    policy = sched.progress[0].policy
    for r in records[1:]:
        assert set(r.trace) == {"sketch", "decisions"}
        again = policy.from_trace(r.trace)  # the trace rebuilds exactly the measured program
        assert again is not None and again.key == json.dumps(r.steps, separators=(",", ":"))


def test_injected_faults_become_error_codes_and_tuning_goes_on(tuned):
    sched, db, faulty, _ = tuned
    records = list(db)
    for i, (_, code) in FAULTS.items():
        assert records[i].error == code and records[i].costs == () and not records[i].ok, records[i].error_message
    errors = dict(sched.stats.errors)
    errors.pop(BUILD_TIMEOUT, None)
    assert errors == {RUN: 1, RUN_TIMEOUT: 1, WRONG_ANSWER: 1}
    later = records[max(FAULTS) + 1 :]
    assert {r.error for r in later} <= {None, BUILD_TIMEOUT}, [(r.error, r.error_message) for r in later if not r.ok]
    assert sum(r.ok for r in later) >= len(later) // 2
    assert sched.progress[0].best == min(r.mean_cost for r in records) < float("inf")
    # a build per round, then builds of the fastest programs, timed again when tuning ended (retime_best: the three
    # fastest, then any that overtook them): their records hold those timings too (and a confirmed best's second)
    again = faulty.batches[TRIALS // PER_ROUND :]
    # a batch per pass, but a later pass times its challengers RETIME_CHALLENGERS at a time, RETIME_MAX_CHALLENGERS
    # per task: each pass's last batch may be partial
    most_batches = RETIME_PASSES + RETIME_MAX_CHALLENGERS // RETIME_CHALLENGERS
    assert 1 <= len(again) <= most_batches and len(again[0]) == 3
    assert sched.stats.retimed == RETIME_ROUNDS * sum(len(b) for b in again)
    retimed = {json.dumps(r.steps, separators=(",", ":")) for r in records if len(r.costs) > 2}
    assert 3 <= len(retimed) and retimed <= {k for b in again for k in b}
    # (the incumbent of a later pass is timed beside each batch of its challengers: RETIME_ROUNDS more per batch)
    most = 2 + RETIME_ROUNDS * most_batches
    assert all(1 + RETIME_ROUNDS <= len(r.costs) <= most for r in records if len(r.costs) > 2)


def test_valid_records_are_timed_and_compute_the_right_answer(tuned):
    _, db, _, _ = tuned
    valid = [r for r in db if r.error is None]
    assert len(valid) == TRIALS - len(FAULTS) - sum(r.error == BUILD_TIMEOUT for r in db) >= TRIALS // 2
    for r in valid:
        assert r.costs and all(0 < c < 1 for c in r.costs)
    states = [apply_steps(DAG, [step_from_record(s) for s in r.steps]) for r in valid]
    kernels = compile_funcs([lower(s, f"k{i}") for i, s in enumerate(states)])
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((N, N)).astype(np.float32) for _ in range(2))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for i, state in enumerate(states):
        out = np.full((N, N), np.nan, np.float32)
        kernels[f"k{i}"](a, b, out)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-4, err_msg=str(state))


def test_resume_never_measures_a_program_twice_and_continues_the_count(tuned, builder, runner, tmp_path):
    _, db, _, _ = tuned
    path = tmp_path / "records.jsonl"
    shutil.copy(db.path, path)
    db2 = JSONLinesDatabase(path)
    before = {r.identity for r in db2}
    old_keys = {json.dumps(r.steps, separators=(",", ":")) for r in db2}
    recorder = FaultyBuilder(builder, tmp_path, {})
    options = TuneOptions(trials=MORE_TRIALS, measures_per_round=PER_ROUND, params=PARAMS, seed=0)  # the same seed
    sched = TaskScheduler([TASK], db2, options, model=RandomModel(0), builder=recorder, runner=runner)
    assert sched.resume() == TRIALS
    p = sched.progress[0]
    assert p.trials == TRIALS and len(p.policy.measured) == TRIALS and p.best < float("inf")
    sched.run()
    rounds = MORE_TRIALS // PER_ROUND  # the builds after those: the fastest programs, timed again (retime_best)
    searched, again = recorder.batches[:rounds], recorder.batches[rounds:]
    built = [k for batch in searched for k in batch]
    assert len(built) == len(set(built)) == MORE_TRIALS
    most_batches = RETIME_PASSES + RETIME_MAX_CHALLENGERS // RETIME_CHALLENGERS  # (see the fault test)
    assert 1 <= len(again) <= most_batches and {k for b in again for k in b} <= old_keys | set(built)
    assert not set(built) & old_keys  # neither the default schedule nor any searched program is measured again
    records = list(db2)
    assert len(records) == TRIALS + MORE_TRIALS  # every commit was new: no identity was already stored
    assert len({r.identity for r in records}) == len(records) and before <= {r.identity for r in records}
    assert p.trials == TRIALS + MORE_TRIALS and sched.stats.trials == MORE_TRIALS
    assert all(r.trace is not None for r in records[TRIALS:])


def test_resume_takes_only_this_tasks_records_from_this_host(tuned, builder, runner, tmp_path):
    _, db, _, _ = tuned
    path = tmp_path / "records.jsonl"
    shutil.copy(db.path, path)
    db2 = JSONLinesDatabase(path)
    r = next(iter(db2))
    assert db2.commit(replace(r, workload_key="another-workload"))
    assert db2.commit(replace(r, host="another-host"))
    assert db2.commit(replace(r, cache=COLD_WEIGHTS))  # the same schedule timed with its weights flushed
    sched = TaskScheduler(
        [TASK], db2, TuneOptions(trials=1, params=PARAMS), model=RandomModel(0), builder=builder, runner=runner
    )
    assert runner.cache == WARM and sched.resume() == TRIALS

    class ColdRunner:  # times with the weights flushed: the warm records are not its measurements
        cache = COLD_WEIGHTS

    cold = TaskScheduler([TASK], db2, TuneOptions(trials=1, params=PARAMS), builder=builder, runner=ColdRunner())
    assert cold.resume() == 1


def test_gradient_copes_with_tasks_that_count_no_flops(tmp_path):
    from compiler.costs.cost_model import RandomModel
    from compiler.costs.records import JSONLinesDatabase
    from compiler.search.task_scheduler import TaskScheduler
    from compiler.tensor import te
    from compiler.tensor.dag import ComputeDAG
    from compiler.tensor.tasks import Task

    x = te.placeholder((8, 8), "float32", "x")
    copy = ComputeDAG([x, te.compute((8, 8), lambda i, j: x[j, i], name="transpose")])
    assert copy.flop_count == 0
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    task = Task(copy.workload_key, copy, "transpose")
    sched = TaskScheduler([task], db, model=RandomModel(0), builder=object(), runner=object())
    p = sched.progress[0]
    p.best, p.rounds, p.history = 1e-6, 2, [2e-6, 1e-6]
    assert sched._gradient(0) <= 0 and sched._pick([0]) == 0


def test_warm_up_round_shrinks_with_the_task_share_of_the_model_flops(tmp_path):
    a, b = te.placeholder((8, 8), name="A"), te.placeholder((8, 8), name="B")
    small = ComputeDAG([a, b, ops.matmul(a, b, name="C")])  # 1/512 of TASK's FLOPs
    tasks = [TASK, Task(small.workload_key, small, "matmul8", weight=64)]  # 1/8 of the weighted FLOPs
    sched = TaskScheduler(
        tasks, JSONLinesDatabase(tmp_path / "r.jsonl"), TuneOptions(measures_per_round=64), builder=..., runner=...
    )
    assert [sched._warmup_size(p) for p in sched.progress] == [64, 16]
    tasks[1].weight = 256  # half
    assert [sched._warmup_size(p) for p in sched.progress] == [64, 32]


def test_without_the_default_schedule_every_program_comes_from_the_search(builder, runner, tmp_path):
    db = JSONLinesDatabase(tmp_path / "records.jsonl")
    options = TuneOptions(trials=4, measures_per_round=4, params=PARAMS, seed=3, measure_default=False)
    TaskScheduler([TASK], db, options, model=XGBModel(seed=3), builder=builder, runner=runner).run()
    records = list(db)
    assert len(records) == 4 and all(r.trace is not None for r in records)
    assert program_key(default_schedule(DAG)) not in {json.dumps(r.steps, separators=(",", ":")) for r in records}


@pytest.mark.parametrize("share", [1 / 3, None])
def test_a_round_that_measures_faster_than_it_searches_shrinks_the_next_population(share, tmp_path):
    """Measuring here takes no time (a builder and runner that answer at once), so every search costs more than
    its measurement: the rule gives the next round the smallest population; without the rule it stays full."""
    from compiler.costs.measure import MeasureResult
    from compiler.search.task_scheduler import MIN_POPULATION

    class Instant(InstantBuilder):
        cache = WARM

        def run(self, inputs, builds):
            return [MeasureResult((1e-3,), None, "", 0.0, 0.0) for _ in inputs]

    params = SearchParams(population=256, num_iters=1)
    options = TuneOptions(trials=16, measures_per_round=8, params=params, seed=0, max_search_share=share)
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    populations = []
    sched = TaskScheduler(
        [TASK],
        db,
        options,
        model=RandomModel(0),
        builder=Instant(),
        runner=Instant(),
        callback=lambda s: populations.append(s.progress[0].population),
    )
    sched.run()
    assert populations == ([MIN_POPULATION] * 2 if share else [None, None])
    # a round whose measurement took 10 times its search keeps (or regains) the parameters' population; the rule
    # counts from the task's first round, so the rounds above (their real search time, seconds on a loaded host)
    # are cleared first
    p = sched.progress[0]
    p.search_s = p.measure_s = 0.0
    sched._next_population(p, MIN_POPULATION, search_s=1.0, measure_s=10.0)
    assert p.population == (256 if share else None)


@pytest.mark.parametrize("share", [1 / 3, None])
def test_a_round_that_measures_fewer_programs_searches_a_smaller_population(share, tmp_path):
    """Under the search-share rule a warm-up round of 16 of 64 searches a quarter of the population (never below
    MIN_POPULATION, never above the parameters'); without the rule every round searches the full population."""
    from compiler.search.task_scheduler import MIN_POPULATION

    params = SearchParams(population=1024, num_iters=1)
    options = TuneOptions(trials=64, measures_per_round=64, params=params, seed=0, max_search_share=share)
    sched = TaskScheduler([TASK], JSONLinesDatabase(tmp_path / "r.jsonl"), options, model=RandomModel(0))
    p = sched.progress[0]
    sizes = [sched._population(p, n) for n in (64, 16, 2)]
    assert sizes == ([1024, 256, MIN_POPULATION] if share else [1024, 1024, 1024])
    p.population = 200  # what the rule gave this task after its last round: a small round scales that down
    assert sched._population(p, 16) == (MIN_POPULATION if share else 200)


def test_the_search_share_counts_from_the_tasks_first_round(tmp_path):
    """A first round that searched as long as it measured (half its time, at the full population) is paid back: the
    next round searches the smallest population, and later rounds grow back as the task's search share, counted
    over all its rounds, reaches a third (a rule sized on each round alone would keep it above)."""
    from compiler.search.task_scheduler import MIN_POPULATION

    params = SearchParams(population=1024, num_iters=1)
    options = TuneOptions(trials=64, measures_per_round=64, params=params, seed=0, max_search_share=1 / 3)
    sched = TaskScheduler([TASK], JSONLinesDatabase(tmp_path / "r.jsonl"), options, model=RandomModel(0))
    p, populations = sched.progress[0], []
    for population, search_s in ((1024, 4.0), (MIN_POPULATION, 0.5), (384, 1.5)):
        sched._next_population(p, population, search_s=search_s, measure_s=4.0)
        populations.append(p.population)
    assert populations[0] == MIN_POPULATION  # 4 s searched against 4 measured: nothing left for the next round
    assert abs(populations[1] - 384) <= 1 and abs(populations[2] - 512) <= 1, populations
    assert p.search_s / (p.search_s + p.measure_s) == pytest.approx(1 / 3)


@pytest.mark.parametrize("confirm", [True, False])
@pytest.mark.parametrize("second", ["slow", "wrong", "lost"])
def test_a_new_best_is_timed_twice_before_it_counts(confirm, second, tmp_path):
    """The winner's curse: one program of the round is timed in a lucky moment (1e-5 s, the others 1e-3 s and
    more). Timed again it takes 5e-3 s (or computes a wrong answer): its record holds both timings (or the second
    run's error); then the round's next fastest, 1e-3 s, is timed again too and holds, and it is the task's best.
    A second measurement that fails through no fault of the program (a farm batch lost: "unknown") leaves the first
    timing as it was. Without confirmation the lucky timing stands."""
    from compiler.costs.measure import MeasureResult

    class Lucky:
        cache = WARM

        def __init__(self):
            self.calls, self.first = 0, {}

        def run(self, inputs, builds):
            self.calls += 1
            if self.calls == 1:
                self.first = {id(inp): 1e-5 if k == 3 else 1e-3 * (k + 1) for k, inp in enumerate(inputs)}
                return [MeasureResult((self.first[id(inp)],), None, "", 0.0, 0.0) for inp in inputs]
            (inp,) = inputs
            if self.first[id(inp)] > 1e-5:  # an honest timing holds
                return [MeasureResult((self.first[id(inp)],), None, "", 0.0, 0.0)]
            if second == "wrong":
                return [MeasureResult((), "wrong_answer", "differs from the reference", 0.0, 0.0)]
            if second == "lost":
                return [MeasureResult((), "unknown", "measurement batch lost 3 times", 0.0, 0.0)]
            return [MeasureResult((5e-3,), None, "", 0.0, 0.0)]

    options = TuneOptions(trials=8, measures_per_round=8, params=PARAMS, seed=0, confirm_best=confirm, retime_best=0)
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    runner = Lucky()
    sched = TaskScheduler([TASK], db, options, model=RandomModel(0), builder=InstantBuilder(), runner=runner)
    sched.run()
    records = list(db)
    lucky, honest = records[3], records[0]
    if not confirm or second == "lost":
        assert len(records) == 8 and runner.calls == 1 + confirm and sched.stats.confirmed == confirm
        assert lucky.costs == (1e-5,) and lucky.error is None and sched.progress[0].best == 1e-5
        return
    assert len(records) == 8 and runner.calls == 3 and sched.stats.confirmed == 2
    assert honest.costs == (1e-3, 1e-3) and sched.progress[0].best == 1e-3
    assert list(JSONLinesDatabase(tmp_path / "r.jsonl")) == records  # the file holds the second timings too
    if second == "slow":
        assert lucky.costs == (1e-5, 5e-3) and lucky.error is None
    else:
        assert lucky.error == "wrong_answer"


def test_an_interrupted_confirmation_still_counts_the_round(tmp_path):
    """A farm job cancelled while it waits for a confirmation (the runner raises): the round's measurements are
    committed and counted with their first timings, then the interruption propagates."""
    from compiler.costs.measure import MeasureResult

    class Cancelled(Exception):
        pass

    class CancelledOnSecondCall:
        cache = WARM

        def __init__(self):
            self.calls = 0

        def run(self, inputs, builds):
            self.calls += 1
            if self.calls > 1:
                raise Cancelled("job cancelled")
            return [MeasureResult((1e-3 * (k + 1),), None, "", 0.0, 0.0) for k in range(len(inputs))]

    options = TuneOptions(trials=16, measures_per_round=8, params=PARAMS, seed=0)
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    rounds = []
    runner = CancelledOnSecondCall()
    sched = TaskScheduler(
        [TASK],
        db,
        options,
        model=RandomModel(0),
        builder=InstantBuilder(),
        runner=runner,
        callback=lambda s: rounds.append(s.stats.trials),
    )
    with pytest.raises(Cancelled):
        sched.run()
    assert runner.calls == 2 and rounds == [8] and sched.stats.trials == 8 and sched.stats.confirmed == 0
    assert len(list(db)) == 8 and sched.progress[0].best == 1e-3 and [r.costs for r in db][0] == (1e-3,)


def test_the_fastest_programs_are_timed_again_side_by_side_when_tuning_ends(tmp_path):
    """retime_best: one program won the round with a lucky timing (1e-5 s; it runs in 5e-3). When the budget is
    spent the three fastest are timed again RETIME_ROUNDS times, each round in another order; their records keep
    every timing, and the task's best (the estimate, and what compile applies) is the fastest mean: the honest
    runner-up, timed beside the others. No program timed once beats it, so nothing more is timed. Resumed with no
    budget left, nothing is timed again."""

    def true(n: int) -> float:  # the 4th program (n = 3) runs in 5e-3 s; its first timing was a lucky one
        return 5e-3 if n == 3 else 1e-3 * (n + 1)

    def noisy() -> FirstThenLater:
        return FirstThenLater(lambda n: 1e-5 if n == 3 else true(n), true)

    options = TuneOptions(trials=8, measures_per_round=8, params=PARAMS, seed=0, confirm_best=False)
    path = tmp_path / "r.jsonl"
    runner = noisy()
    sched = TaskScheduler(
        [TASK], JSONLinesDatabase(path), options, model=RandomModel(0), builder=InstantBuilder(), runner=runner
    )
    sched.run()
    assert runner.calls == 1 + RETIME_ROUNDS and sched.stats.retimed == 3 * RETIME_ROUNDS
    first, second = runner.batches
    assert sorted(first) == sorted(second) and first != second and len(first) == 3
    records = list(JSONLinesDatabase(path))
    costs = sorted((r.costs for r in records if len(r.costs) > 1), key=sum)
    assert costs == [(1e-3,) * 3, (2e-3,) * 3, (1e-5, 5e-3, 5e-3)]
    assert sched.progress[0].best == 1e-3 == sched.estimated_latency and sched.stats.trials == 8

    again = TaskScheduler(
        [TASK],
        JSONLinesDatabase(path),
        TuneOptions(trials=0, params=PARAMS),
        model=RandomModel(0),
        builder=InstantBuilder(),
        runner=noisy(),
    )
    assert again.resume() == 8
    again.run()
    assert again.runner.calls == 0 and again.progress[0].best == 1e-3


def test_programs_timed_once_that_beat_the_retimed_best_are_timed_beside_it(tmp_path):
    """A plateau: 16 programs timed 1.00, 1.01, ... 1.15 ms once, and every later timing 0.2 ms slower (the winner's
    curse, or a host that slowed down). The three fastest, timed again, come out at +0.13 ms on average, behind eleven
    programs timed once, and their latest timings (1.20 ms and up) behind all thirteen; the next pass times those
    thirteen beside the incumbent (the fastest re-timed one), RETIME_CHALLENGERS at a time, and so on until the task's
    best is a program timed side by side: never one that was timed once."""
    options = TuneOptions(trials=16, measures_per_round=16, params=PARAMS, seed=0, confirm_best=False)
    path = tmp_path / "r.jsonl"
    runner = FirstThenLater(lambda n: 1e-3 + 1e-5 * n, lambda n: 1e-3 + 1e-5 * n + 2e-4)
    sched = TaskScheduler(
        [TASK], JSONLinesDatabase(path), options, model=RandomModel(0), builder=InstantBuilder(), runner=runner
    )
    sched.run()
    order = sorted(runner.position, key=runner.position.get)  # fastest first
    batches = runner.batches[::RETIME_ROUNDS]
    assert runner.batches[1::RETIME_ROUNDS] != batches  # each round of a batch in another order
    assert sorted(batches[0]) == sorted(order[:3])
    # the second pass: the thirteen timed once below the incumbent's latest timings (order[0]: 1.00, then 1.20 and
    # 1.20 ms), 8 then 5, each batch beside it
    assert sorted(batches[1]) == sorted(order[3 : 3 + RETIME_CHALLENGERS] + order[:1])
    assert sorted(batches[2]) == sorted(order[3 + RETIME_CHALLENGERS :] + order[:1])
    assert sched.stats.retimed == sum(len(b) for b in runner.batches)
    records = list(JSONLinesDatabase(path))
    best = min(records, key=lambda r: r.mean_cost)
    assert len(best.costs) > 1
    timed_once = [r.mean_cost for r in records if len(r.costs) == 1]
    assert all(c > best.mean_cost for c in timed_once) and best.mean_cost == sched.progress[0].best


def test_a_host_slowing_during_the_retiming_leaves_no_program_timed_once_ahead(tmp_path):
    """A wider plateau (40 programs timed once at 1.000, 1.005, ... 1.195 ms) and a host that slows while the
    re-timing runs: each later timing is 0.2 ms slower plus 2 us more per batch timed before it. After the first
    pass the incumbent's mean (1.14 ms) is behind 26 programs timed once, in faster minutes, and its latest timings
    (1.20 ms) behind all 37; the next pass times those, RETIME_CHALLENGERS at a time beside the incumbent, and the
    task's best ends on a program timed side by side. Against the incumbent's mean alone, programs timed once slipped
    ahead of it one pass after another, and the fourth pass still left one there."""
    options = TuneOptions(trials=40, measures_per_round=40, params=PARAMS, seed=0, confirm_best=False)
    path = tmp_path / "r.jsonl"

    def later(n: int) -> float:  # 0.2 ms slower, and 2 us more for every batch timed before this one
        return 1e-3 + 5e-6 * n + 2e-4 + 2e-6 * len(runner.batches)

    runner = FirstThenLater(lambda n: 1e-3 + 5e-6 * n, later)
    sched = TaskScheduler(
        [TASK], JSONLinesDatabase(path), options, model=RandomModel(0), builder=InstantBuilder(), runner=runner
    )
    sched.run()
    order = sorted(runner.position, key=runner.position.get)  # fastest first
    batches = runner.batches[::RETIME_ROUNDS]
    challengers = [k for b in batches[1:] for k in b if k not in batches[0]]
    assert len(set(challengers)) <= RETIME_MAX_CHALLENGERS
    assert all(len(b) <= RETIME_CHALLENGERS + 1 for b in batches[1:])
    assert set(order[3:]) == set(challengers)  # all 37, in the second pass (5 batches beside the incumbent)
    assert all(order[0] in b for b in batches[1:]) and len(batches) == 1 + 5
    records = list(JSONLinesDatabase(path))
    best = min(records, key=lambda r: r.mean_cost)
    assert len(best.costs) > 1 and best.mean_cost == sched.progress[0].best
    assert all(r.mean_cost > best.mean_cost for r in records if len(r.costs) == 1)


def test_retiming_passes_over_a_record_this_version_cannot_replay(tmp_path):
    """The fastest record of the task has a step this version does not know (another version's, on the same host):
    the re-timing at the end times the others beside each other and leaves it; the task's best is the fastest one
    that replays, as compile would apply."""
    from compiler.costs.measure import MeasureResult, to_record

    class Timer:
        cache = WARM

        def __init__(self):
            self.batches, self.cost = [], {}

        def run(self, inputs, builds):  # each program runs in its own time, 1, 2, 3... ms in the order first seen
            self.batches.append(len(inputs))
            for inp in inputs:
                self.cost.setdefault(key_of(inp), 1e-3 * (len(self.cost) + 1))
            return [MeasureResult((self.cost[key_of(inp)],), None, "", 0.0, 0.0) for inp in inputs]

    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    unreadable = to_record(
        MeasureInput(TASK, default_schedule(DAG).steps),
        MeasureResult((1e-6,), None, "", 0.0, 0.0),
        host_target(),
    )
    db.commit(replace(unreadable, steps=(("StepOfALaterVersion", 1),)))
    options = TuneOptions(trials=8, measures_per_round=8, params=PARAMS, seed=0, confirm_best=False)
    sched = TaskScheduler([TASK], db, options, model=RandomModel(0), builder=InstantBuilder(), runner=Timer())
    sched.run()
    # the round's 8; then the fastest three hold the unreadable one, and the other two are timed side by side
    assert sched.runner.batches == [8] + [2] * RETIME_ROUNDS
    stored = [r for r in JSONLinesDatabase(tmp_path / "r.jsonl") if r.steps == (("StepOfALaterVersion", 1),)]
    assert [r.costs for r in stored] == [(1e-6,)]
    assert sched.progress[0].best == 1e-3


class PerTaskRunner:
    """Times every program of a task at that task's fixed latency (by its DAG's first placeholder's shape)."""

    cache = WARM

    def __init__(self, latency: dict[tuple, float]):
        self.latency = latency

    def run(self, inputs, builds):
        return [MeasureResult((self.latency[inp.task.dag.ops[0].shape],), None, "", 0.0, 0.0) for inp in inputs]


def _two_tasks():
    a, b = te.placeholder((8, 8), name="A"), te.placeholder((8, 8), name="B")
    small = ComputeDAG([a, b, ops.matmul(a, b, name="C")])
    return [TASK, replace(Task(small.workload_key, small, "matmul8"), weight=2)]


def test_the_estimate_follows_the_model_timed_in_its_run(tmp_path):
    # the tuner times matmul64 at 1 ms and matmul8 at 0.5 ms (twice per run): 2 ms alone; in the model's run the
    # first call takes 3 ms, the others 0.5, and the run 5 ms (1 ms of overhead). Once timed, the estimate is the run
    tasks = _two_tasks()
    runner = PerTaskRunner({(N, N): 1e-3, (8, 8): 0.5e-3})
    timings = []

    class Timing:
        run_s, per_call, calls = 5e-3, {tasks[0].key: 3e-3, tasks[1].key: 0.5e-3}, {tasks[0].key: 1, tasks[1].key: 2}
        overhead_s, programs = 1e-3, {}

    def timer(rounds):
        timings.append(rounds)
        return Timing()

    options = TuneOptions(trials=80, measures_per_round=8, params=PARAMS, seed=0, retime_best=0)
    sched = TaskScheduler(
        tasks, JSONLinesDatabase(tmp_path / "r.jsonl"), options, model=RandomModel(0), builder=InstantBuilder(),
        runner=runner, model_timer=timer,
    )  # fmt: skip
    sched.run()
    assert sched.kernels_latency == pytest.approx(2e-3)
    assert sched.estimated_latency == pytest.approx(5e-3)
    first, *_, last = sched.model_checks
    # after the warm-up: the estimate was the kernels' own; at the end it had followed the run already
    assert first.estimate_s == pytest.approx(2e-3) and first.run_s == 5e-3 and first.note == ""
    assert last.estimate_s == pytest.approx(5e-3)
    # after the warm-up (16 trials), then a quarter of the trials later but MODEL_TIMING_ROUNDS rounds at least (32),
    # and at the end (the last round's timing was that: nothing measured since, so not timed twice)
    assert [c.trials for c in sched.model_checks] == [16, 48, 80] and timings == [1, 1, 1]
    assert "run 5.000 ms; estimate before it 5.000 ms (+0.0%)" in sched.table()
    # a task that costs more in the run weighs more in the objective: matmul64's gradient is 3x its kernel-only one
    sched.progress[0].history = [2e-3, 1.5e-3, 1.2e-3, 1e-3]
    with_factor = sched._gradient(0)
    sched._factor = {}
    assert with_factor == pytest.approx(3 * sched._gradient(0))


def _judging_scheduler(tmp_path, untuned_per_call: dict[int, float]):
    """Two tasks tuned with a model timer whose tuned model runs each call at the kernel's own latency and whose
    untuned model (every default schedule) at `untuned_per_call` (by task index); what the timer was asked, in
    order, as (rounds, untuned)."""
    tasks, asked = _two_tasks(), []
    db = JSONLinesDatabase(tmp_path / "r.jsonl")
    host, target = host_target(), target_name(host_target())

    def timing(per_call: dict[str, float], programs: dict[str, tuple]):
        calls = {tasks[0].key: 1, tasks[1].key: 2}
        run = sum(calls[k] * s for k, s in per_call.items())
        return ModelTiming(run, per_call, calls, programs)

    def timer(rounds, untuned=False):
        asked.append((rounds, untuned))
        if untuned:
            programs = {t.key: as_tuples([st.record() for st in default_schedule(t.dag, host).steps]) for t in tasks}
            return timing({t.key: untuned_per_call[i] for i, t in enumerate(tasks)}, programs)
        best = {t.key: judged_in_model(t, db, host, best_replaying(t, db, host)) for t in tasks}
        return timing({k: found[0].mean_cost for k, found in best.items()}, {k: f[0].steps for k, f in best.items()})

    options = TuneOptions(trials=32, measures_per_round=8, params=PARAMS, seed=0, retime_best=1, measure_default=False)
    sched = TaskScheduler(
        tasks, db, options, model=RandomModel(0), builder=InstantBuilder(),
        runner=PerTaskRunner({(N, N): 1e-3, (8, 8): 0.5e-3}), model_timer=timer,
    )  # fmt: skip
    sched.run()
    return sched, tasks, db, asked, target


def test_the_final_check_times_the_model_tuned_and_untuned_and_keeps_the_faster_program_in_the_run(tmp_path):
    # matmul64's default runs its calls at 0.8 ms in the untuned model, faster than the tuned program's 1 ms there;
    # matmul8's default at 0.9 ms, slower than its tuned 0.5 ms. Each program's in-run time becomes an in-model
    # record, and compile then takes matmul64's default and matmul8's tuned program
    sched, tasks, db, asked, target = _judging_scheduler(tmp_path, {0: 0.8e-3, 1: 0.9e-3})
    host = host_target()
    # the final check: tuned and untuned, FINAL_TIMING_ROUNDS rounds each, and the tuned model again since a default won
    assert asked[-3:] == [(FINAL_TIMING_ROUNDS, False), (FINAL_TIMING_ROUNDS, True), (FINAL_TIMING_ROUNDS, False)]
    assert FINAL_TIMING_ROUNDS > 1 and set(asked[:-3]) == {(1, False)}
    for t, default_cost, tuned_cost in ((tasks[0], 0.8e-3, 1e-3), (tasks[1], 0.9e-3, 0.5e-3)):
        judged = db.best(t.key, target, host.fingerprint(), k=5, cache=IN_MODEL)
        assert sorted(r.mean_cost for r in judged) == sorted([default_cost, tuned_cost])
    default64 = as_tuples([st.record() for st in default_schedule(tasks[0].dag, host).steps])
    chosen = {t.key: judged_in_model(t, db, host, best_replaying(t, db, host))[0] for t in tasks}
    assert chosen[tasks[0].key].steps == default64 and chosen[tasks[0].key].cache == IN_MODEL
    assert chosen[tasks[1].key].mean_cost == 0.5e-3
    # the check ends on the model as compile now builds it: 0.8 + 2 x 0.5 ms; the untuned model ran 0.8 + 2 x 0.9
    last = sched.model_checks[-1]
    assert last.note == "final" and last.run_s == pytest.approx(1.8e-3) and last.untuned_s == pytest.approx(2.6e-3)
    assert sched.estimated_latency == pytest.approx(1.8e-3)
    assert "run 1.800 ms; untuned 2.600 ms" in sched.table()
    # a program that turns out faster later (timed again, or found by a resumed tuning) was not judged in the run: it
    # stands
    judged_steps = {r.steps for r in db.best(tasks[1].key, target, host.fingerprint(), k=5, cache=IN_MODEL)}
    other = next(
        r for r in db.best(tasks[1].key, target, host.fingerprint(), k=50, cache=WARM) if r.steps not in judged_steps
    )
    assert db.remeasured(replace(other, costs=(0.1e-3,)))
    assert judged_in_model(tasks[1], db, host, best_replaying(tasks[1], db, host))[0].steps == other.steps


def test_a_final_check_where_the_tuned_programs_win_times_the_model_once(tmp_path):
    _, _, _, asked, _ = _judging_scheduler(tmp_path, {0: 2e-3, 1: 0.9e-3})
    assert asked[-2:] == [(FINAL_TIMING_ROUNDS, False), (FINAL_TIMING_ROUNDS, True)]


def test_a_model_timer_that_fails_leaves_the_kernels_estimate(tmp_path):
    def timer(rounds):
        raise RuntimeError("no C compiler")

    options = TuneOptions(trials=16, measures_per_round=8, params=PARAMS, seed=0, retime_best=0)
    sched = TaskScheduler(
        _two_tasks(), JSONLinesDatabase(tmp_path / "r.jsonl"), options, model=RandomModel(0),
        builder=InstantBuilder(), runner=PerTaskRunner({(N, N): 1e-3, (8, 8): 0.5e-3}), model_timer=timer,
    )  # fmt: skip
    sched.run()
    assert sched.estimated_latency == pytest.approx(2e-3)
    assert sched.model_checks and all(c.note == "RuntimeError: no C compiler" for c in sched.model_checks)
    assert "model timing after 16 trials failed: RuntimeError: no C compiler" in sched.table()
