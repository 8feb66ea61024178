"""The task scheduler (Ansor §6): share a trial budget across a model's tasks, measure, learn, repeat.

Each round picks one task, asks its search policy for a batch of new programs, builds and runs them, commits the
records, and retrains the (shared) cost model. After a warm-up round over every task, the task is the one whose
improvement of the objective f = Σ weight·latency per trial is estimated largest (Ansor's gradient: a backward
difference over the last rounds mixed with an optimistic forward guess; α = 0.2, β = 2, window 3). A conv that can be
compiled in two forms (tasks.FormChoice) counts in f once, as the faster of its forms' tasks: the other form's task
lowers f only by what it is expected to undercut it.
"""

from __future__ import annotations

import atexit
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from compiler.base.errors import TilefarmError
from compiler.base.target import Target
from compiler.costs.cost_model import CostModel, XGBModel
from compiler.costs.measure import PROGRAM_FAULTS, Builder, MeasureInput, MeasureResult, Runner, to_record
from compiler.costs.records import (
    IN_MODEL,
    KERNEL_CONDITIONS,
    Database,
    TuningRecord,
    best_replaying,
    judged_in_model,
    target_name,
    training_group,
)
from compiler.schedule.state import apply_steps, program_key, step_from_record
from compiler.search.budget import first_round_size
from compiler.search.evolution import Candidate, SearchParams, SearchPolicy
from compiler.targets import backend_for, host_target
from compiler.tensor.tasks import (
    FormChoice,
    Step,
    Task,
    chosen_cost,
    chosen_form,
    constant_bytes,
    weights_arrive_cold,
)

ALPHA, BETA, WINDOW = 0.2, 2.0, 3
SHARED_BEST = 4  # programs a task hands each sibling task per round (TuneOptions.share_siblings)
CONFIRM_PER_ROUND = 3  # programs of one round timed a second time at most (TuneOptions.confirm_best)
RETIME_ROUNDS = 2  # times each task's fastest programs are timed again, side by side, when tuning ends (retime_best)
RETIME_PASSES = 4  # passes of the re-timing at most (the first, then challengers beside the incumbent; _retime)
RETIME_CHALLENGERS = 8  # programs not re-timed but faster than the re-timed best, timed beside it in one batch
RETIME_MAX_CHALLENGERS = 64  # such programs timed per task at most, over all passes
MODEL_TIMING_ROUNDS = 4  # rounds' worth of trials at least between two timings of the whole model (model_timer)
# the final timing of the whole model, the one the estimate ends on, takes the fastest of this many rounds a second or
# so apart (compiler.artifact.in_model.time_in_model's `rounds`): one round at the end of a 2-thread MobileNetV2
# tuning read 41% slower than the rounds before it and than a fresh process
FINAL_TIMING_ROUNDS = 3
MIN_POPULATION = 128  # the smallest population the search-share rule gives a round (TuneOptions.max_search_share)


@dataclass
class TaskProgress:
    """One task under tuning: its policy, trials, best latency so far, and the best latency after each round."""

    task: Task
    policy: SearchPolicy
    trials: int = 0
    rounds: int = 0
    best: float = math.inf
    history: list[float] = field(default_factory=list)
    since_improvement: int = 0
    done: bool = False
    why_done: str = ""
    population: int | None = None  # the next round's; None: the search parameters'
    resumed: int = 0  # of the trials, those taken from the database (TaskScheduler.resume)
    search_s: float = 0.0  # this run's seconds searching for the task, and building and timing its programs
    measure_s: float = 0.0

    @property
    def gflops(self) -> float:
        return self.task.flop_count / self.best / 1e9 if math.isfinite(self.best) else 0.0


@dataclass
class TuneStats:
    """Where the tuning wall time went."""

    search_s: float = 0.0
    build_s: float = 0.0
    run_s: float = 0.0
    train_s: float = 0.0
    model_timing_s: float = 0.0  # compiling and timing the whole model (TaskScheduler's model_timer)
    wall_s: float = 0.0
    trials: int = 0
    confirmed: int = 0  # new bests timed a second time (TuneOptions.confirm_best)
    retimed: int = 0  # timings taken when tuning ended (TuneOptions.retime_best)
    errors: dict[str, int] = field(default_factory=dict)

    def shares(self) -> dict[str, float]:
        total = max(self.wall_s, 1e-9)
        return {k: getattr(self, f"{k}_s") / total for k in ("search", "build", "run", "train", "model_timing")}


@dataclass
class TuneOptions:
    trials: int = 1000
    measures_per_round: int = 64
    time_budget: float | None = None  # seconds of wall time
    early_stopping: int | None = None  # per task: stop after this many trials without improvement
    strategy: str = "gradient"  # or "round-robin"
    seed: int = 0
    params: SearchParams = field(default_factory=SearchParams)
    # a task's first round measures the rule-based default schedule too (False: only what the search proposes, as
    # bench.transfer compares searches)
    measure_default: bool = True
    # Searching a task should take at most this share of its time: after each round the task's next population is
    # sized so that its search time so far, plus the next round's (proportional to the population), comes to
    # share / (1 - share) of its measuring time so far plus one more round like the last, between MIN_POPULATION
    # and the parameters' population. Counting from the start, a first round at the full population is paid back
    # by the later ones (sized round by round, conv layers ended at 32-35%). A model's small tasks measure in a
    # fraction of the time their search takes (ResNet-18 at 2 threads spent 45% of its tuning in search with a
    # fixed population). None keeps the full population every round, as Ansor does.
    max_search_share: float | None = 1 / 3
    # Tasks with a sketch of the same shape (same anchor stage and tiling, another epilogue: ResNet's conv + ReLU
    # and conv + residual add + ReLU on one shape) hand each other their SHARED_BEST fastest programs every round:
    # translated, they seed the evolution, and the first ones not measured yet are measured as they are
    # (search.FOREIGN_MEASURED_PER_ROUND per round). False tunes every task alone, as Ansor does.
    share_siblings: bool = True
    # A program that beats its task's best so far is timed once more before it counts (its record then holds both
    # timings, its cost their mean). On a shared host a timing is noisy, and the fastest of hundreds of noisy
    # timings is partly luck (the winner's curse): the best is then a program that was timed in a quiet moment, and
    # the task scheduler's estimates are too low. False trusts a single timing, as Ansor does.
    confirm_best: bool = True
    # When the budget is spent, each task's this many fastest programs are timed again RETIME_ROUNDS times, side by
    # side (one after another, round after round), and their records keep those timings too. Each best so far won
    # a race of single timings, so it was likely timed in a fast moment; timed beside its runners-up, the order
    # between them and the task's latency (the estimate, and what compile picks) rest on several timings taken
    # under the same conditions (a few seconds per task, on top of time_budget). Programs not re-timed whose
    # timings still beat the re-timed best are then timed beside it (`_retime`). 0 ends with the single timings, as
    # Ansor does.
    retime_best: int = 3
    # With a model timer (TaskScheduler's `model_timer`: the model compiled with the records so far and timed whole,
    # compiler.artifact.in_model), the model is timed after the warm-up, each time this share of the trials has
    # passed since (MODEL_TIMING_ROUNDS rounds at least), and at the end: each task's in-run time over its tuned time
    # scales its share of the estimate and of the objective the next task is chosen by, and the run's time beyond its
    # calls joins the estimate.
    model_timing_every: float = 0.25


def refuse_unguarded_main() -> None:
    """In a worker process that is importing the user's script (multiprocessing's forkserver re-runs the main module in
    every process it starts) tuning must not start again: a script that calls the tuner without an
    `if __name__ == "__main__":` guard would otherwise print pages of bootstrap errors from each worker. Such a worker
    says so in one line and ends; the tuner then finds every measurement failed and says that."""
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        atexit.register(_unguarded_flag(os.getpid()).unlink, missing_ok=True)
        return
    parent = multiprocessing.parent_process()
    flag = _unguarded_flag(parent.pid if parent else os.getppid())
    try:  # the first of the workers says it; the others end quietly
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        print(
            "error: tilefarm's tuner was started again while a worker process imported your script: call it under "
            '`if __name__ == "__main__":` (worker processes import the main module)',
            file=sys.stderr,
            flush=True,
        )
    except OSError:
        pass
    os._exit(1)


def _unguarded_flag(tuner: int) -> Path:
    return Path(tempfile.gettempdir()) / f"tilefarm-unguarded-{tuner}"


class TaskScheduler:
    def __init__(
        self,
        tasks: list[Task],
        database: Database,
        options: TuneOptions | None = None,
        *,
        model: CostModel | None = None,
        builder: Builder | None = None,
        runner: Runner | None = None,
        target: Target | None = None,
        callback: Callable[[TaskScheduler], None] | None = None,
        choices: Sequence[FormChoice] = (),
        model_timer: Callable[..., InModelTiming] | None = None,
    ):
        """`tasks`: a model's tasks (plan_tasks), and the tasks of its convs' other forms (form_choices, weight 0);
        `choices`: those convs, each counted in the objective as the faster of its forms; `model_timer`: times the
        model compiled with the records so far (TuneOptions.model_timing_every), the fastest of as many rounds as it
        is given (`model_timer(rounds)`), or with no records (`model_timer(rounds, untuned=True)`: the final check's
        untuned model)."""
        refuse_unguarded_main()
        self.options = options or TuneOptions()
        self.target = target or host_target()
        backend = backend_for(self.target)
        self.database = database
        self.model = model if model is not None else XGBModel(seed=self.options.seed)
        self._own = builder is None or runner is None
        self.builder = builder or backend.builder(target=self.target)
        self.runner = runner or backend.runner(repeat=1)
        self.callback = callback
        self.rng = np.random.default_rng(self.options.seed)
        self.stats = TuneStats()
        self.progress = [
            TaskProgress(t, SearchPolicy(t.dag, self.model, self.target, self.options.params, self.options.seed + i))
            for i, t in enumerate(tasks)
        ]
        index = {p.task.key: i for i, p in enumerate(self.progress)}
        missing = sorted({t.name for c in choices for t in c.tasks if t.key not in index})
        if missing:
            raise ValueError(f"the form choices name tasks that are not tuned: {', '.join(missing)}")
        self._choices = [tuple(index[t.key] for t in c.tasks) for c in choices]
        # calls of each task that are no choice's: its weight less the choices whose rule form it is
        self._fixed = [p.task.weight for p in self.progress]
        for forms in self._choices:
            self._fixed[forms[0]] -= 1
        self.resumed = 0
        self.model_timer = model_timer
        self._factor: dict[int, float] = {}  # task index -> its in-run time over its tuned time, at the last timing
        self._overhead = 0.0  # the last timed run's seconds beyond its calls' in-run times (in_model.ModelTiming)
        self.model_checks: list[ModelCheck] = []
        self._next_timing = 0
        self._sibling_lists: dict[int, list[TaskProgress]] = {}
        # per task, programs of sibling workloads the database holds (tuned for other models), ranked as _foreign does
        self._stored: dict[int, list[tuple[float, int, Candidate]]] | None = None

    # ------------------------------------------------------------------------------------------ resume

    def resume(self, train: bool = True) -> int:
        """Take every record of these tasks (this target and host, timed in the runner's cache condition) from the
        database as measured: never measured again, counted as trials, the best kept, and (with `train`; not for a
        cost model loaded from a file, which holds them already) the cost model trained on them. Returns how many
        were taken."""
        by_key = {p.task.key: p for p in self.progress}
        xs, costs, groups = [], [], []
        target, host = target_name(self.target), self.target.fingerprint()
        # timings of another cache condition do not compare with this runner's: those candidates are measured again
        for rec in self.database.records_of(by_key, target, host, cache=self.runner.cache):
            p = by_key[rec.workload_key]
            key = rec.identity[2]  # the step list as JSON, the form program_key gives
            if key in p.policy.measured:
                continue
            cand = p.policy.from_trace(rec.trace) if rec.trace else None
            if cand is None or cand.key != key:
                try:
                    state = apply_steps(p.task.dag, [step_from_record(s) for s in rec.steps])
                except TilefarmError:
                    continue
                cand = Candidate(-1, None, state, key)
            cost = rec.mean_cost
            p.policy.record([cand], [cost])
            p.trials += 1
            p.resumed += 1
            p.best = min(p.best, cost)
            if train:
                xs.append(p.policy.features_of(cand))
                costs.append(cost)
                groups.append(training_group(p.task.key, rec.cache))
            self.resumed += 1
        for p in self.progress:
            if p.trials:
                p.rounds = max(1, math.ceil(p.trials / self.options.measures_per_round))
                p.history = [p.best] * p.rounds
        if xs:
            self.model.update(xs, costs, groups)
        return self.resumed

    # ------------------------------------------------------------------------------------------ rounds

    def run(self) -> list[TaskProgress]:
        start = time.perf_counter()
        opts = self.options
        if self._stored is None:
            self.seed_from_stored_siblings()
        try:
            # warm-up: every task not yet measured gets a round (the default schedule joins its first batch)
            for i, p in enumerate(self.progress):
                if p.trials == 0 and not self._out_of_budget(start):
                    self._round(i, with_default=opts.measure_default, size=self._warmup_size(p))
            self._time_model()
            while not self._out_of_budget(start):
                live = [i for i, p in enumerate(self.progress) if not p.done]
                if not live:
                    break
                if opts.strategy == "gradient":
                    self._round(self._pick(live))
                else:
                    self._round(min(live, key=lambda k: self.progress[k].rounds))
                if self.stats.trials >= self._next_timing:
                    self._time_model()
            if opts.retime_best:
                for p in self.progress:
                    self._retime(p)
            self._time_model(final=True)
        finally:
            self.stats.wall_s += time.perf_counter() - start
            if self._own:
                self.close()
        return self.progress

    def _out_of_budget(self, start: float) -> bool:
        if self.stats.trials >= self.options.trials:
            return True
        return self.options.time_budget is not None and time.perf_counter() - start >= self.options.time_budget

    def _pick(self, live: list[int]) -> int:
        grads = np.array([self._gradient(i) for i in live])
        best = np.flatnonzero(grads == grads.min())
        return live[int(best[self.rng.integers(len(best))])]

    def _gradient(self, i: int) -> float:
        """d objective / d rounds for task i, as in Ansor's TaskScheduler (negative = the objective drops); where the
        task is one form of a conv (FormChoice), by how much one more round would lower the cost of the form compile
        takes (tasks.chosen_form: a form that stays within FORM_MARGIN of the rule's lowers nothing)."""
        p = self.progress[i]
        if not math.isfinite(p.best):
            return 0.0
        step = self._step(p)
        grad = self._fixed[i] * step * self._factor.get(i, 1.0)
        for forms in self._choices:
            if i in forms:
                now = [self._in_model(j) for j in forms]
                after = [b + step * self._factor.get(i, 1.0) if j == i else b for j, b in zip(forms, now)]
                grad += chosen_cost(after) - chosen_cost(now)
        return grad

    def _in_model(self, i: int) -> float:
        """Task i's best latency as a call of it lasts in the model's run (its tuned latency where none was timed)."""
        return self.progress[i].best * self._factor.get(i, 1.0)

    def _time_model(self, final: bool = False) -> None:
        """Time the model compiled with the records so far (the `model_timer`), once every task has a program:
        each task's factor becomes its in-run time per call over its best tuned time, and the run's overhead beyond
        its calls is kept. A timer that fails is reported in the check and changes nothing."""
        if self.model_timer is None or not all(math.isfinite(p.best) for p in self.progress):
            return
        last = self.model_checks[-1] if self.model_checks else None
        if final and last is not None and last.trials == self.stats.trials and not self.stats.retimed:
            return  # nothing measured since: the same programs
        opts = self.options
        every = max(int(opts.trials * opts.model_timing_every), MODEL_TIMING_ROUNDS * opts.measures_per_round)
        self._next_timing = self.stats.trials + every
        before, alone = self.estimated_latency, self.kernels_latency
        t = time.perf_counter()
        try:
            timing = self.model_timer(FINAL_TIMING_ROUNDS if final else 1)
        except Exception as e:  # noqa: BLE001 - the tuning goes on with the kernels' own timings
            self.model_checks.append(ModelCheck(self.stats.trials, alone, before, math.nan, f"{type(e).__name__}: {e}"))
            return
        finally:
            self.stats.model_timing_s += time.perf_counter() - t
        untuned_s, note = math.nan, "final" if final else ""
        if final:
            t = time.perf_counter()
            try:
                timing, untuned_s = self._judge_in_model(timing)
            except Exception as e:  # noqa: BLE001 - the tuned programs stand; the check says why none was judged
                note = f"final; the untuned model was not timed: {type(e).__name__}: {e}"
            finally:
                self.stats.model_timing_s += time.perf_counter() - t
        for i, p in enumerate(self.progress):
            per_call = timing.per_call.get(p.task.key)
            if per_call is not None and p.best > 0:
                self._factor[i] = per_call / p.best
        self._overhead = timing.overhead_s
        self.model_checks.append(ModelCheck(self.stats.trials, alone, before, timing.run_s, note, untuned_s))

    def _judge_in_model(self, tuned: InModelTiming) -> tuple[InModelTiming, float]:
        """The final check's verdict between each task's tuned program and its default schedule, in the model's run:
        the untuned model (every task's default) is timed as the tuned one was, and each program's time per call in
        its run is stored as an IN_MODEL record. Compile then takes, per task, the faster in the run
        (records.judged_in_model), so a kernel that won alone and loses in the run (the cache state its neighbours
        leave, another thread count's balance) does not make the model slower tuned than untuned. Where a default
        won, the model is timed again as compile now builds it. Returns that timing and the untuned run's."""
        assert self.model_timer is not None
        untuned = self.model_timer(FINAL_TIMING_ROUNDS, untuned=True)
        target, host = target_name(self.target), self.target.fingerprint()
        for timing in (tuned, untuned):
            for key, per_call in timing.per_call.items():
                steps = timing.programs.get(key)
                if steps is None:
                    continue
                rec = TuningRecord(key, target, host, steps, (per_call,), cache=IN_MODEL)
                if not self.database.commit(rec):
                    self.database.remeasured(rec)
        keys = {p.task.key for p in self.progress}
        defaults_won = [
            k
            for k, s in untuned.per_call.items()
            if k in keys and s < tuned.per_call.get(k, 0.0) and untuned.programs.get(k) != tuned.programs.get(k)
        ]
        if defaults_won:
            tuned = self.model_timer(FINAL_TIMING_ROUNDS)
        return tuned, untuned.run_s

    def _step(self, p: TaskProgress) -> float:
        """The task's expected latency change in one more round (Ansor's backward and forward estimates)."""
        h = p.history
        backward = (h[-1] - h[-1 - WINDOW]) / WINDOW if len(h) > WINDOW else 0.0
        g_next_1 = p.best - p.best / max(p.rounds, 1)
        group_speed = [q.task.flop_count / q.best for q in self._similar(p) if math.isfinite(q.best)]
        fastest = max(group_speed, default=0.0)  # 0 for data-movement tasks, which count no FLOPs
        g_next_2 = BETA * p.task.flop_count / fastest if fastest > 0 else math.inf
        forward = min(g_next_1, g_next_2) - p.best
        return ALPHA * backward + (1 - ALPHA) * forward

    def calls(self, i: int) -> int:
        """How many calls of the model task i makes with the programs found so far: its calls that are no choice's,
        and those of the choices where its form is the one compile would take (tasks.chosen_form)."""
        return self._fixed[i] + sum(1 for forms in self._choices if self._chosen(forms) == i)

    def _chosen(self, forms: tuple[int, ...]) -> int:
        """The task of a conv's forms that compile would take by the programs found so far."""
        return forms[chosen_form([self.progress[j].best for j in forms])]

    def _similar(self, p: TaskProgress) -> list[TaskProgress]:
        tag = _similarity_tag(p.task)
        return [q for q in self.progress if _similarity_tag(q.task) == tag]

    def _warmup_size(self, p: TaskProgress) -> int:
        """The trials of the task's first round (compiler.search.budget.first_round_size)."""
        work = max(q.task.weight * q.task.flop_count for q in self.progress)
        return first_round_size(self.options.measures_per_round, p.task.weight * p.task.flop_count, work)

    def first_round_trials(self) -> list[int]:
        """Per task, the trials of the first round the warm-up gives it (0 for a task measured already): their sum is
        the budget it takes to measure every task once."""
        return [0 if p.trials else self._warmup_size(p) for p in self.progress]

    def _round(self, i: int, with_default: bool = False, size: int | None = None) -> None:
        p = self.progress[i]
        n = min(size or self.options.measures_per_round, self.options.trials - self.stats.trials)
        if n <= 0:
            return
        t0 = time.perf_counter()
        population = self._population(p, n)
        cands = p.policy.next_batch(n - 1 if with_default else n, population, self._foreign(i))
        if with_default:
            state = backend_for(self.target).default_schedule(p.task.dag, self.target)
            cands = [Candidate(-1, None, state, program_key(state)), *cands]
        search_s = time.perf_counter() - t0
        self.stats.search_s += search_s
        if not cands:
            p.done, p.why_done = True, "search space exhausted"
            return
        inputs = [MeasureInput(p.task, c.state.steps, c.trace) for c in cands]
        t0 = t_measure = time.perf_counter()
        builds = self.builder.build(inputs)
        self.stats.build_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            results = self.runner.run(inputs, builds)
            for inp, res in zip(inputs, results):
                self._commit(inp, res)
            results, interrupted = self._confirm_best(p, inputs, builds, results)
        finally:
            _discard(builds)
        self.stats.run_s += time.perf_counter() - t0
        self._next_population(p, population, search_s, time.perf_counter() - t_measure)
        costs = [res.mean_cost for res in results]
        p.policy.record(cands, costs)
        before = p.best
        p.best = min([p.best, *costs])
        p.trials += len(cands)
        p.rounds += 1
        p.history.append(p.best)
        self.stats.trials += len(cands)
        p.since_improvement = 0 if p.best < before else p.since_improvement + len(cands)
        if self.options.early_stopping is not None and p.since_improvement >= self.options.early_stopping:
            p.done, p.why_done = True, f"no improvement in {p.since_improvement} trials"
        if not math.isfinite(p.best) and p.rounds >= 1:
            p.done, p.why_done = True, "no valid program"
        t0 = time.perf_counter()
        xs = p.policy.featurize(cands)
        self.model.update(xs, costs, [training_group(p.task.key, self.runner.cache)] * len(cands))
        self.stats.train_s += time.perf_counter() - t0
        if self.callback:
            self.callback(self)
        if interrupted is not None:  # a confirmation was interrupted: the round is counted, now it goes on
            raise interrupted

    def _siblings(self, i: int) -> list[TaskProgress]:
        if i not in self._sibling_lists:
            p = self.progress[i]
            self._sibling_lists[i] = [
                q for j, q in enumerate(self.progress) if j != i and p.policy.has_sibling_sketch(q.policy)
            ]
        return self._sibling_lists[i]

    def seed_from_stored_siblings(self) -> int:
        """Find, in a database that stores workloads' DAGs (the team's SQL database), the sibling workloads of these
        tasks that other models brought (same reductions, a sketch of the same shape) and take their SHARED_BEST
        fastest records timed in this runner's cache condition, translated: each task's siblings hand it those
        programs as they hand it their live ones (`_foreign`), so a conv tuned in one model starts the same conv
        under another epilogue in the next. Returns how many programs were taken."""
        self._stored = {}
        workload_dags = getattr(self.database, "workload_dags", None)
        if not self.options.share_siblings or workload_dags is None:
            return 0
        by_anchors: dict[tuple, list[int]] = {}
        for i, p in enumerate(self.progress):
            if anchors := _anchors(p.task.dag):
                by_anchors.setdefault(anchors, []).append(i)
        mine = {p.task.key for p in self.progress}
        target, host = target_name(self.target), self.target.fingerprint()
        taken = 0
        for key, dag in workload_dags().items():
            wanted = by_anchors.get(_anchors(dag), []) if key not in mine else []
            records = self.database.best(key, target, host, k=SHARED_BEST, cache=self.runner.cache) if wanted else []
            if not records:
                continue
            source = SearchPolicy(dag, self.model, self.target, self.options.params, self.options.seed)
            traced = [(r, source.from_trace(r.trace)) for r in records if r.trace]
            for i in wanted:
                for rank, (r, c) in enumerate(traced):
                    moved = self.progress[i].policy.translate(source, c) if c is not None else None
                    if moved is not None:
                        self._stored.setdefault(i, []).append((r.mean_cost / records[0].mean_cost, rank, moved))
                        taken += 1
        return taken

    def _foreign(self, i: int) -> list[Candidate]:
        """The sibling tasks' fastest programs as programs of task i, fastest (in their own task) first: those of
        the tasks tuned with it and those of the database's sibling workloads (seed_from_stored_siblings)."""
        if not self.options.share_siblings:
            return []
        p = self.progress[i]
        ranked = list((self._stored or {}).get(i, []))
        for q in self._siblings(i):
            for rank, c in enumerate(q.policy.best_measured(SHARED_BEST)):
                moved = p.policy.translate(q.policy, c)
                if moved is not None:
                    ranked.append((q.policy.measured[c.key] / q.best, rank, moved))
        ranked.sort(key=lambda t: (t[0], t[1]))
        return [c for _, _, c in ranked]

    def _confirm_best(
        self, p: TaskProgress, inputs: list[MeasureInput], builds: list, results: list[MeasureResult]
    ) -> tuple[list[MeasureResult], BaseException | None]:
        """Time this round's fastest program once more if it beats the task's best so far (TuneOptions.confirm_best):
        its result, and its stored record (Database.remeasured), then hold both timings. If the second timing drops it
        behind another program of the round that also beats the best, that one is timed again too, until the round's
        fastest is a confirmed one (at most CONFIRM_PER_ROUND). A program that fails the second time by its own fault
        (PROGRAM_FAULTS: a race the first run got away with) takes the second run's error; a failure that is not the
        program's (a lost farm batch) leaves its first timing. A confirmation that raises (a farm job stopped while
        it waits, Ctrl-C) ends the confirming: the round keeps its first timings (committed before any confirmation) and
        is counted, and the exception is returned for `_round` to raise after that, so that the records its
        measurements made are never left out of the trials."""
        if not self.options.confirm_best:
            return results, None
        results, confirmed = list(results), set()
        while len(confirmed) < CONFIRM_PER_ROUND:
            faster = [k for k, r in enumerate(results) if r.ok and r.mean_cost < p.best]
            if not faster:
                break
            k = min(faster, key=lambda k: results[k].mean_cost)
            if k in confirmed:
                break
            try:
                again = self.runner.run([inputs[k]], [builds[k]])[0]
            except BaseException as e:  # noqa: BLE001 - raised again by _round once the round is counted
                return results, e
            self.stats.confirmed += 1
            confirmed.add(k)
            self._commit(inputs[k], again, second=True)
            first = results[k]
            if again.ok:
                costs, seconds = first.costs + again.costs, first.run_seconds + again.run_seconds
                results[k] = replace(first, costs=costs, run_seconds=seconds)
            elif again.error in PROGRAM_FAULTS:
                results[k] = again
        return results, None

    def _commit(self, inp: MeasureInput, res: MeasureResult, second: bool = False) -> None:
        """Store a measurement: a new record, or (`second`: a confirmation, a re-timing) one more timing of the
        stored record, or its failure if that is the program's fault (PROGRAM_FAULTS). A new record that is already
        stored (a farm's measure worker commits its batch itself) is left as it is."""
        rec = to_record(inp, res, self.target)
        if not second:
            self.database.commit(rec)
        elif res.ok or res.error in PROGRAM_FAULTS:
            self.database.remeasured(rec)
        if res.error:
            self.stats.errors[res.error] = self.stats.errors.get(res.error, 0) + 1

    def _retime(self, p: TaskProgress) -> None:
        """Time the task's TuneOptions.retime_best fastest records again, RETIME_ROUNDS times side by side, each
        timing added to its record (Database.remeasured). Timed again, the best usually comes out slower than the
        single timing that made it a best (the winner's curse), and then programs not timed here (timed once, or twice
        as a new best) may beat it on their timings: each later pass times all of those, the fastest first, side by
        side with it, the incumbent, RETIME_CHALLENGERS at a time (RETIME_MAX_CHALLENGERS per task, RETIME_PASSES in
        all), until the task's best, the one compile applies, is a program timed beside the others. "Beat" is
        measured against the incumbent's latest side-by-side timings where those are slower than its mean: a host
        that slows during the re-timing raises the incumbent's mean pass by pass, and against the mean alone programs
        timed once would slip ahead of it one pass after another. On a plateau of programs within a few percent of
        each other (common near the end of a search) a fixed three per pass was not enough: GEMM 1024 ended on a
        program timed once, 2% ahead of the re-timed ones, that ran 1.4x slower in the benchmark's processes; nor was
        one batch of eight per pass when the host slowed during the re-timing (AVX2 GEMM 1024 at 2 threads: 71
        programs timed once in faster minutes were left ahead of the incumbent, and compile took one that ran 12%
        slower than it). A task that measured nothing in this run (all its trials resumed) is left alone, and a record
        this version cannot replay is passed over (compile skips it too)."""
        if p.trials == p.resumed:  # nothing new since the records it resumed from: they stay as they are
            return
        target, host, cache = target_name(self.target), self.target.fingerprint(), self.runner.cache
        timed: set[tuple] = set()  # identities of the records timed side by side here
        unreadable: set[tuple] = set()  # identities of records this version cannot replay
        challengers = RETIME_MAX_CHALLENGERS  # left to time beside an incumbent
        for _ in range(RETIME_PASSES):
            k = len(timed) + len(unreadable) + self.options.retime_best + max(challengers, RETIME_CHALLENGERS)
            ranked = [
                r
                for r in self.database.best(p.task.key, target, host, k=k, cache=cache)
                if r.identity not in unreadable
            ]
            incumbent = next((r for r in ranked if r.identity in timed), None)
            if not timed:
                batches = [ranked[: self.options.retime_best]]
            elif incumbent is None:  # every re-timed one fell behind more than k others: time the fastest of those
                batches = [ranked[:RETIME_CHALLENGERS]]
            else:
                # the bar: the incumbent's mean, or its latest side-by-side timings where those are slower (a host
                # that slowed since the search timed the others): a program timed once below it may be faster now
                bar = max(incumbent.mean_cost, statistics.fmean(incumbent.costs[-RETIME_ROUNDS:]))
                ahead = [r for r in ranked if r.identity not in timed and r.mean_cost < bar][:challengers]
                challengers -= len(ahead)
                batches = [
                    ahead[i : i + RETIME_CHALLENGERS] + [incumbent] for i in range(0, len(ahead), RETIME_CHALLENGERS)
                ]
            if not any(batches):
                break
            for todo in batches:
                self._time_beside(p, todo, timed, unreadable)
        best = best_replaying(p.task, self.database, self.target, (cache,))
        p.best = best[0].mean_cost if best else math.inf

    def _time_beside(self, p: TaskProgress, todo: list[TuningRecord], timed: set, unreadable: set) -> None:
        """One batch of `_retime`: these records timed side by side, those this version cannot replay passed over."""
        inputs, new = [], 0
        for r in todo:
            inp = replay_input(p.task, r)
            if inp is None:
                unreadable.add(r.identity)
                continue
            new += r.identity not in timed
            timed.add(r.identity)
            inputs.append(inp)
        if new:  # (the incumbent alone, its challengers all unreadable, has nothing to be timed beside)
            self._side_by_side(inputs)

    def _side_by_side(self, inputs: list[MeasureInput]) -> None:
        """Build these programs once and time them RETIME_ROUNDS times, each round in another order, into their
        records."""
        t0 = time.perf_counter()
        builds = self.builder.build(inputs)
        self.stats.build_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        try:
            for r in range(RETIME_ROUNDS):
                order = [(k + r) % len(inputs) for k in range(len(inputs))]  # each round starts with another one
                results = self.runner.run([inputs[k] for k in order], [builds[k] for k in order])
                for k, res in zip(order, results):
                    self._commit(inputs[k], res, second=True)
                self.stats.retimed += len(results)
        finally:
            _discard(builds)
            self.stats.run_s += time.perf_counter() - t0

    def _population(self, p: TaskProgress, n: int) -> int:
        """This round's population. Under the search-share rule, a round that measures fewer than a full round's
        programs (a warm-up round, the last round of the budget) searches a proportionally smaller population, down
        to MIN_POPULATION: warm-up rounds of 16 with the full population were most of ResNet-18's search time (19
        tasks, half of a 600-trial budget)."""
        population = p.population or self.options.params.population
        per_round = self.options.measures_per_round
        if self.options.max_search_share is None or n >= per_round:
            return population
        return min(population, max(MIN_POPULATION, population * n // per_round))

    def _next_population(self, p: TaskProgress, population: int, search_s: float, measure_s: float) -> None:
        share = self.options.max_search_share
        p.search_s += search_s
        p.measure_s += measure_s
        if share is None or search_s <= 0:
            return
        budget = share / (1 - share) * (p.measure_s + measure_s) - p.search_s  # the next round's search seconds
        want = population * budget / search_s
        p.population = int(min(max(want, MIN_POPULATION), self.options.params.population))

    # ------------------------------------------------------------------------------------------ reporting

    @property
    def estimated_latency(self) -> float:
        """Σ calls × best latency over tasks, a conv with a choice of forms at the one compile would take (inf while a
        task has no valid program); once the model was timed (`model_timer`), each latency as the task's calls last
        in the run, plus the run's overhead beyond its calls."""
        fixed = sum(f * self._in_model(i) for i, f in enumerate(self._fixed) if f)
        chosen = sum(chosen_cost([self._in_model(j) for j in forms]) for forms in self._choices)
        return fixed + chosen + self._overhead

    @property
    def kernels_latency(self) -> float:
        """The estimate from the kernels' own timings alone: Σ calls × best tuned latency."""
        fixed = sum(f * p.best for f, p in zip(self._fixed, self.progress) if f)
        return fixed + sum(chosen_cost([self.progress[j].best for j in forms]) for forms in self._choices)

    def table(self) -> str:
        rows = [
            f"{'ID':>3} {'task':<28} {'MFLOP':>9} {'weight':>6} {'GFLOP/s':>8} {'latency ms':>10} "
            f"{'weighted ms':>11} {'trials':>6} {'done':>4}"
        ]
        for k, p in enumerate(self.progress):
            lat, calls = p.best * 1e3, self.calls(k)
            rows.append(
                f"{k:>3} {p.task.name[:28]:<28} {p.task.flop_count / 1e6:>9.2f} {calls:>6} {p.gflops:>8.2f} "
                f"{lat:>10.4f} {lat * calls if calls else 0.0:>11.4f} {p.trials:>6} {'yes' if p.done else '':>4}"
            )
        est = self.estimated_latency * 1e3
        missing = sum(1 for p in self.progress if not math.isfinite(p.best))
        unknown = f" ({missing} tasks without a measured program yet)" if missing else ""
        rows.append(f"estimated end-to-end latency: {est:.3f} ms{unknown}   trials: {self.stats.trials}")
        for c in self.model_checks:
            rows.append(c.describe())
        return "\n".join(rows)

    def close(self) -> None:
        for x in (self.builder, self.runner):
            close = getattr(x, "close", None)
            if close:
                close()


class InModelTiming(Protocol):
    """A compiled model's run timed on this host (compiler.artifact.in_model.ModelTiming)."""

    run_s: float
    per_call: dict[str, float]  # task key -> seconds of one call inside the run
    programs: dict[str, tuple]  # task key -> the steps of the program its calls ran

    @property
    def overhead_s(self) -> float: ...


@dataclass(frozen=True)
class ModelCheck:
    """One timing of the whole model during tuning: after how many trials, the estimate from the kernels alone and
    the estimate just before (both seconds), the run measured (nan where the timer failed), and a note."""

    trials: int
    kernels_s: float
    estimate_s: float
    run_s: float
    note: str = ""
    untuned_s: float = math.nan  # the final check's: the model with every task's default schedule

    def describe(self) -> str:
        if not math.isfinite(self.run_s):
            return f"model timing after {self.trials} trials failed: {self.note}"
        off = (self.estimate_s / self.run_s - 1) * 100
        final = self.note.startswith("final")
        untuned = f"; untuned {self.untuned_s * 1e3:.3f} ms" if math.isfinite(self.untuned_s) else ""
        why = self.note.removeprefix("final").removeprefix("; ") if final else self.note
        return (
            f"{'the compiled model' if final else 'model'} timed after {self.trials} trials: "
            f"run {self.run_s * 1e3:.3f} ms{untuned}; estimate before it {self.estimate_s * 1e3:.3f} ms ({off:+.1f}%), "
            f"from the kernels alone {self.kernels_s * 1e3:.3f} ms ({(self.kernels_s / self.run_s - 1) * 100:+.1f}%)"
            + (f" ({why})" if why else "")
        )


def replay_input(task: Task, record: TuningRecord) -> MeasureInput | None:
    """The record's program, to measure again; None for a record this version cannot replay (compile skips it too)."""
    try:
        return MeasureInput(task, tuple(step_from_record(s) for s in record.steps), record.trace)
    except TilefarmError:
        return None


def _discard(builds: list) -> None:
    """Delete the built libraries once their measurements are done."""
    for b in builds:
        if b.path:
            Path(b.path).unlink(missing_ok=True)


def _similarity_tag(task: Task) -> tuple:
    """Ansor groups tasks by op kind and FLOPs magnitude for the forward-gradient guess."""
    tags = tuple(sorted({op.tag for op in task.dag.ops if op.tag}))
    return tags, int(math.log(task.flop_count + 1, 1.618))


TRIALS_PER_TASK = 800  # measured programs after which `inspect` counts a task as tuned (TVM advises ~800 per task)


@dataclass(frozen=True)
class TaskCoverage:
    """What a database already holds for one task on one target and host."""

    task: Task
    valid: int  # error-free records for this target and host, counted up to the per-task budget
    best: TuningRecord | None  # the fastest of them that still replays (the one compile would apply)
    trials_needed: int  # the per-task budget minus `valid`: 0 once the task has that many


def _anchors(dag) -> tuple:
    """A DAG's reductions by tag, shape and dtype: two tasks with a sketch of the same shape have the same ones (a
    filter before any sketch of a stored workload is made)."""
    return tuple(sorted((op.tag, tuple(op.shape), op.dtype) for op in dag.ops if op.reduce_axes))


def coverage(
    tasks: list[Task],
    database: Database,
    target: Target | None = None,
    trials_per_task: int = TRIALS_PER_TASK,
    prefer: Sequence[str] = KERNEL_CONDITIONS,
) -> list[TaskCoverage]:
    """Per task, the database's records valid here: error-free, for this target and measured on a host with this
    fingerprint (timings from another machine class do not count), in any cache condition; the record compile would
    apply (its cache conditions in the order `prefer`); and the trials still needed by the rule
    max(0, trials_per_task - valid records)."""
    target = target or host_target()
    out = []
    for t in tasks:
        stored = database.best(t.key, target_name(target), target.fingerprint(), k=trials_per_task)
        found = [r for r in stored if r.cache != IN_MODEL]  # an in-model record times a measured program again
        best = judged_in_model(t, database, target, best_replaying(t, database, target, prefer))
        out.append(TaskCoverage(t, len(found), best[0] if best else None, max(0, trials_per_task - len(found))))
    return out


def tune(
    tasks: list[Task],
    database: Database,
    options: TuneOptions | None = None,
    resume: bool = False,
    **kwargs,
) -> TaskScheduler:
    """Tune `tasks`, committing every measurement to `database`; returns the finished scheduler."""
    sched = TaskScheduler(tasks, database, options, **kwargs)
    if resume:
        sched.resume()
    sched.run()
    return sched


__all__ = [
    "TaskScheduler",
    "TaskProgress",
    "TaskCoverage",
    "TuneOptions",
    "TuneStats",
    "coverage",
    "tune",
    "TuningRecord",
]


def weights_timed_cold(mode: str, calls: Sequence[Step], l3_bytes: int | None, probe: bool = True) -> bool:
    """A WEIGHT_MODES choice made: "cold" and "warm" as said, "auto" cold when `weights_arrive_cold` or, where the
    weights fit the cache's reported size and `probe` (this host is of the class that measures), when this host does
    not keep that many bytes cached as it re-reads them (the backend's keeps_cached, a measurement: a virtual machine
    reports its host's whole cache, not its share)."""
    if mode != "auto":
        return mode == "cold"
    if weights_arrive_cold(calls, l3_bytes):
        return True
    return probe and not backend_for(host_target()).keeps_cached(constant_bytes(calls))
