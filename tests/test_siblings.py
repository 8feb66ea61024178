"""Sibling tasks (same anchor stage and tiling, another epilogue) hand each other their best programs: a program
translates to the sibling's sketch of the same shape with the stage names mapped, still computes the sibling's
result, and the task scheduler measures a sibling's best in the next round of the task that has not seen it."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from compiler.costs.cost_model import RandomModel
from compiler.costs.measure import BuildResult, MeasureResult
from compiler.costs.records import JSONLinesDatabase
from compiler.schedule import interp
from compiler.schedule.lower import lower
from compiler.search.evolution import SearchParams, SearchPolicy, SketchShape
from compiler.search.task_scheduler import TaskScheduler, TuneOptions
from compiler.targets.cpu.codegen import compile_funcs
from compiler.tensor import ops, te
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task

N = 32
ZERO = te.const(0.0, "float32")


def matmul_relu(n: int = N) -> ComputeDAG:
    a, b = te.placeholder((n, n), name="a"), te.placeholder((n, n), name="b")
    c = ops.matmul(a, b, name="mm")
    return ComputeDAG([a, b, te.compute(c.shape, lambda i, j: te.maximum(c[i, j], ZERO), name="relu")])


def matmul_add_relu(n: int = N) -> ComputeDAG:
    """The same matmul under another epilogue, with other stage names: + residual, then ReLU."""
    x, w, r = (te.placeholder((n, n), name=s) for s in ("x", "w", "res"))
    c = ops.matmul(x, w, name="prod")
    s = te.compute(c.shape, lambda i, j: c[i, j] + r[i, j], name="plus")
    return ComputeDAG([x, w, r, te.compute(c.shape, lambda i, j: te.maximum(s[i, j], ZERO), name="out")])


def policy(dag: ComputeDAG, seed: int = 0) -> SearchPolicy:
    return SearchPolicy(dag, RandomModel(seed), params=SearchParams(population=16, num_iters=1), seed=seed)


def test_sketches_of_the_same_matmul_under_another_epilogue_have_one_shape():
    a, b = policy(matmul_relu()), policy(matmul_add_relu())
    assert [SketchShape.of(s).signature for s in a.sketches] == [SketchShape.of(s).signature for s in b.sketches]
    assert b.has_sibling_sketch(a) and a.has_sibling_sketch(b)
    assert not policy(matmul_relu(2 * N)).has_sibling_sketch(a)  # other extents: other tiles


def test_a_translated_program_keeps_its_decisions_and_computes_the_siblings_result():
    a, b = policy(matmul_relu()), policy(matmul_add_relu())
    rng = np.random.default_rng(0)
    x, w, r = (rng.standard_normal((N, N)).astype(np.float32) for _ in range(3))
    want = np.maximum(x @ w + r, 0)
    names = {"mm": "prod", "relu": "out"}
    for c in a.sample_initial(12):
        moved = b.translate(a, c)
        assert moved is not None
        assert moved.decisions.tiles == c.decisions.tiles
        assert moved.decisions.unroll == tuple((names.get(s, s + "?"), v) for s, v in c.decisions.unroll)
        out = np.zeros((N, N), np.float32)
        compile_funcs([lower(moved.state, "k")])["k"](x, w, r, out)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_a_program_of_an_unrelated_task_does_not_translate():
    a, other = policy(matmul_relu()), policy(matmul_relu(2 * N))
    assert all(other.translate(a, c) is None for c in a.sample_initial(4))


class Instant:
    """Builds nothing and answers each program with a fixed pseudo-random time; remembers what each task measured."""

    cache = "warm"

    def __init__(self):
        self.measured: dict[str, list[str]] = {}

    def build(self, inputs):
        return [BuildResult(None, None, "", 0.0) for _ in inputs]

    def run(self, inputs, builds):
        out = []
        for inp in inputs:
            key = repr([s.record() for s in inp.steps])
            self.measured.setdefault(inp.task.key, []).append(key)
            cost = 1e-3 * (1 + int(hashlib.sha1(key.encode()).hexdigest()[:6], 16) / 2**24)
            out.append(MeasureResult((cost,), None, "", 0.0, 0.0))
        return out


@pytest.mark.parametrize("share", [True, False])
def test_the_scheduler_measures_a_siblings_best_program_in_the_next_round(share, tmp_path):
    dags = [matmul_relu(), matmul_add_relu()]
    tasks = [Task(d.workload_key, d, name) for d, name in zip(dags, ("relu", "add_relu"))]
    io = Instant()
    options = TuneOptions(
        trials=24, measures_per_round=8, params=SearchParams(population=16, num_iters=1), share_siblings=share
    )
    sched = TaskScheduler(
        tasks, JSONLinesDatabase(tmp_path / "r.jsonl"), options, model=RandomModel(0), builder=io, runner=io
    )
    first, second = sched.progress
    sched._round(0)  # the first task's round: nothing to take from the second yet
    assert len(sched._foreign(0)) == 0
    best = first.policy.best_measured(1)[0]
    moved = second.policy.translate(first.policy, best)
    foreign = sched._foreign(1)
    if not share:
        assert foreign == []
        return
    assert foreign[0].key == moved.key  # its sibling's fastest program comes first
    sched._round(1)
    assert moved.key in second.policy.measured  # measured in the second task's first round
    assert repr([s.record() for s in moved.state.steps]) in io.measured[tasks[1].key]


def test_the_translated_program_is_what_the_interpreter_computes():
    """The loop nest of a translated program, run by the reference interpreter, equals the sibling's DAG."""
    a, b = policy(matmul_relu(8)), policy(matmul_add_relu(8))
    rng = np.random.default_rng(1)
    x, w, r = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3))
    moved = b.translate(a, a.sample_initial(1)[0])
    got = np.zeros((8, 8), np.float32)
    interp.run(lower(moved.state, "k"), x, w, r, got)
    np.testing.assert_allclose(got, np.maximum(x @ w + r, 0), rtol=1e-5, atol=1e-5)


def test_a_workload_tuned_for_another_model_seeds_its_sibling_from_the_team_database(tmp_path):
    """The team database holds matmul + ReLU, tuned for one model; a later model's matmul + residual + ReLU on the
    same shapes starts from its fastest programs (translated), measured in its first round. A JSON-lines file, which
    stores no DAGs, seeds nothing."""
    from server.database import SQLDatabase

    first, later = (Task(d.workload_key, d, n) for d, n in ((matmul_relu(), "relu"), (matmul_add_relu(), "add_relu")))
    options = TuneOptions(trials=16, measures_per_round=8, params=SearchParams(population=16, num_iters=1))
    with SQLDatabase(f"sqlite:///{tmp_path / 'team.db'}", upgrade_schema=True) as db:
        db.describe_workloads([first, later])
        io = Instant()
        TaskScheduler([first], db, options, model=RandomModel(0), builder=io, runner=io).run()
        stored = db.best(first.key, next(iter(db)).target, k=1)[0]
        sched = TaskScheduler([later], db, options, model=RandomModel(1), builder=io, runner=io)
        assert sched.seed_from_stored_siblings() > 0
        source = policy(matmul_relu())
        moved = sched.progress[0].policy.translate(source, source.from_trace(stored.trace))
        assert sched._foreign(0)[0].key == moved.key  # the stored workload's fastest program first
        sched._round(0)
        assert moved.key in sched.progress[0].policy.measured
    jsonl = JSONLinesDatabase(tmp_path / "r.jsonl")
    jsonl.import_records(list(SQLDatabase(f"sqlite:///{tmp_path / 'team.db'}")))
    assert (
        TaskScheduler([later], jsonl, options, model=RandomModel(1), builder=io, runner=io).seed_from_stored_siblings()
        == 0
    )
