"""Evolutionary search for one task (Ansor §4.2, `SketchPolicy`): sample an initial population from the task's
sketches, evolve it under the cost model's scores, and pick the next batch to measure (best predicted plus a few
random ones, ε-greedy), never one measured before. "Measured before" is judged on the lowered program, not on
the decisions: different decisions can lower to the same loop nest (a compute location on either side of a loop
fused into the parallel one, a split whose factors land in adjacent loops); 16% of a 1,000-trial GEMM 1024 run
re-measured such twins before this check.

Every random choice draws from the policy's seeded generator, so a search replays exactly given the same
measurements.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import functools
import hashlib
import heapq
import multiprocessing
import os
import re
import select
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from compiler.base.errors import InvalidProgram, TilefarmError
from compiler.base.target import Target
from compiler.costs import features
from compiler.costs.cost_model import CostModel
from compiler.schedule.lower import lower
from compiler.schedule.state import Split, State, apply_steps, program_key
from compiler.targets import backend_for, host_target
from compiler.tensor.dag import ComputeDAG

PARALLEL_FEATURES_MIN = 32  # below this many new programs, shipping them to worker processes costs more than it saves
# a population being made goes to the feature workers in jobs of this many new programs, so that they featurize the
# first ones while the search makes the rest (`SearchPolicy._streamed`)
STREAM_CHUNK = 32
FOREIGN_MEASURED_PER_ROUND = 2  # programs translated from sibling tasks measured as they are in one round


@dataclass(frozen=True)
class SearchParams:
    """Ansor's SketchPolicy defaults, except the population: 512 as in MetaSchedule (Ansor: 2048), because every
    candidate is lowered and featurized in Python here (see bench/tuning.py for the measured search share)."""

    population: int = 512
    num_iters: int = 4
    mutation_prob: float = 0.85
    eps_greedy: float = 0.05
    init_measured_ratio: float = 0.2
    init_min_population: int = 50
    max_fail_rounds: int = 5
    # draw the vector loop's innermost tile from multiples of the target's lanes (targets/cpu/annotate.sample);
    # False draws every tile uniformly, as Ansor does
    lane_tiles: bool = True
    # draw and mutate register blocks within the target's vector registers (targets/cpu/annotate.RegisterFile);
    # False leaves them to the cost model, as Ansor does
    register_tiles: bool = True
    # with register_tiles, half the register blocks whose rows no divisor of the extent makes hold the accumulators
    # the target's FMA units need in flight (targets/cpu/host.fmas_in_flight) draw one row count beyond the largest
    # fitting divisor (annotate.sample; schedule/partition.py makes the tails cheap); False draws divisors alone
    ragged_rows: bool = True
    # with register_tiles, count the tile levels auto-unrolling adds to a register block too: draw the unroll step
    # again where the accumulators living across the innermost rolled reduction loop do not fit, and drop mutations
    # that make such a program (RegisterFile.unrolled_demand); False checks the innermost tile alone
    unrolled_blocks: bool = True


@dataclass(frozen=True)
class Candidate:
    """A complete program: which sketch, which decisions, the resulting State and its identity."""

    sketch_index: int
    decisions: Any  # the target kind's; None for programs not made by this search (the default schedule, old records)
    state: State
    key: str

    @property
    def trace(self) -> dict | None:
        if self.decisions is None:
            return None
        return {"sketch": self.sketch_index, "decisions": self.decisions.to_json()}

    @functools.cached_property
    def program(self) -> str:
        """program_identity of the state, lowered once: picking and recording a candidate both need it."""
        return program_identity(self.state)


@dataclass
class SearchStats:
    """Where the search's time went, and how many candidates the cost model scored."""

    scored: int = 0
    featurized: int = 0
    seconds: float = 0.0
    feature_seconds: float = 0.0
    model_seconds: float = 0.0
    invalid: int = 0
    twins: int = 0  # picked candidates dropped because a measured or picked one lowers to the same program
    sent_ahead: int = 0  # programs featurized by the workers while the search made the rest of their population


@dataclass
class SearchPolicy:
    dag: ComputeDAG
    model: CostModel
    target: Target = field(default_factory=host_target)
    params: SearchParams = field(default_factory=SearchParams)
    seed: int = 0

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)
        # the target kind's sketches, annotation and mutation rules for this task
        self.space = backend_for(self.target).search_space(self.dag, self.target, self.params)
        self.sketches = self.space.sketches
        self.measured: dict[str, float] = {}  # program key -> mean seconds (inf when it failed)
        self.measured_candidates: list[tuple[float, Candidate]] = []
        self.measured_programs: set[str] = set()  # program_identity of everything measured
        self.stats = SearchStats()
        self._features = features.FeatureCache()
        self._stream: list[Candidate] | None = None  # new programs of the population being made, not sent yet
        self._in_flight: list[tuple[list[str], concurrent.futures.Future]] = []  # (keys, their features' job)
        self._queued: set[str] = set()  # keys in _stream or _in_flight
        self._population = self.params.population  # this round's
        # (id of a sibling task's policy, its sketch index) -> (this task's sketch of that shape, stage name map)
        self._siblings: dict[tuple[int, int], tuple[int, dict[str, str]] | None] = {}

    # ------------------------------------------------------------------------------------------ candidates

    def candidate(self, sketch_index: int, d: Any) -> Candidate:
        state = self.space.materialize(sketch_index, d)
        return Candidate(sketch_index, d, state, program_key(state))

    def from_trace(self, trace: dict) -> Candidate | None:
        """A candidate from a record's trace, or None if it no longer replays (another tilefarm version)."""
        try:
            i = int(trace["sketch"])
            if not 0 <= i < len(self.sketches):
                return None
            return self.candidate(i, self.space.decisions_from_json(trace["decisions"]))
        except (InvalidProgram, KeyError, TypeError, ValueError, IndexError):
            return None

    def sample_initial(self, n: int) -> list[Candidate]:
        """Random programs from random sketches until `n` distinct valid ones (or the attempts run out)."""
        out: dict[str, Candidate] = {}
        fails = 0
        while len(out) < n and fails < self.params.max_fail_rounds:
            before = len(out)
            for _ in range(n - len(out)):
                i = int(self.rng.integers(len(self.sketches)))
                try:
                    d, state = self.space.sample(i, self.rng)
                    c = Candidate(i, d, state, program_key(state))
                except InvalidProgram:
                    self.stats.invalid += 1
                    continue
                if c.key not in out:
                    out[c.key] = c
                    self._send_soon(c)
            fails = fails + 1 if len(out) == before else 0
        return list(out.values())

    # ------------------------------------------------------------------------------------------ scoring

    def featurize(self, cands: list[Candidate]) -> list[np.ndarray]:
        """Features per candidate, cached by program; a large batch is spread over a process per core."""
        t0 = time.perf_counter()
        self._collect()
        todo = list({c.key: c for c in cands if c.key not in self._features}.values())
        if len(todo) >= PARALLEL_FEATURES_MIN and self.target.cores > 1:
            for c, x in zip(todo, _featurize_in_pool(self.dag, [c.state.steps for c in todo], self.target.cores)):
                self._features.put(c.key, x)
        self.stats.featurized += len(todo)
        xs = [self._features.get_or_compute(c.key, c.state) for c in cands]
        self.stats.feature_seconds += time.perf_counter() - t0
        return xs

    @contextlib.contextmanager
    def _streamed(self) -> Iterator[None]:
        """While a population is made under this, its new programs go to a feature worker (`_send_soon`), so that
        featurizing them overlaps making the rest; `featurize` collects the results. One job runs at a time while
        the search makes programs, so that its process keeps a core (with a job on each of two cores, its CPU time
        rose 5-50%); what is left when the population is made goes out split over every worker. The features are those
        of featurizing the population afterwards, so the search is the same. On one core, or for a population too
        small to pay for the trips, nothing is sent ahead."""
        self._stream = [] if self.target.cores > 1 and self._population >= PARALLEL_FEATURES_MIN else None
        try:
            yield
            for part in _split(self._stream or [], self.target.cores):
                self._send(part)
        finally:
            self._stream = None

    def _send_soon(self, c: Candidate) -> None:
        """Queue a new program of the population being made; send the queue as a job once it holds STREAM_CHUNK
        programs and no job is running."""
        if self._stream is None or c.key in self._queued or c.key in self._features:
            return
        self._stream.append(c)
        self._queued.add(c.key)
        if len(self._stream) >= STREAM_CHUNK and all(job.done() for _, job in self._in_flight):
            self._send(self._stream)
            self._stream = []

    def _send(self, cands: list[Candidate]) -> None:
        job = _submit_features(self.dag, [c.state.steps for c in cands], self.target.cores)
        if job is not None:
            self._in_flight.append(([c.key for c in cands], job))

    def _collect(self) -> None:
        """Take the features of the programs sent ahead; those of a job that failed (a worker died) are left to
        `featurize` to compute here."""
        for keys, job in self._in_flight:
            try:
                xs = job.result()
            except concurrent.futures.process.BrokenProcessPool:
                _drop_pool()
                continue
            for k, x in zip(keys, xs):
                self._features.put(k, x)
            self.stats.featurized += len(keys)
            self.stats.sent_ahead += len(keys)
        self._in_flight.clear()
        self._queued.clear()

    def score(self, cands: list[Candidate]) -> np.ndarray:
        xs = self.featurize(cands)
        t0 = time.perf_counter()
        scores = np.asarray(self.model.predict(xs), dtype=np.float64)
        self.stats.model_seconds += time.perf_counter() - t0
        self.stats.scored += len(cands)
        return scores

    # ------------------------------------------------------------------------------------------ search

    def next_batch(self, n: int, population: int | None = None, foreign: Sequence[Candidate] = ()) -> list[Candidate]:
        """Ansor's SearchOneRound: evolutionary search under the cost model, then ε-greedy picking of `n`
        programs not measured before. `population` overrides the parameters' for this round (the task scheduler
        shrinks it where measuring a round costs less than searching for it). `foreign` are sibling tasks' best
        programs translated to this task (`translate`), best first: the first ones not measured here yet are
        measured as they are (up to FOREIGN_MEASURED_PER_ROUND), and all of them join the population as seeds.

        With nothing to search toward, a model not yet trained (`CostModel.informed`) and neither measured programs
        nor foreign ones to evolve from (a task's first round), the batch is `n` random programs: Ansor evolves a
        random population under random scores there, which also picks random programs, after lowering and
        featurizing a population's worth of them (most of the search time of a small model's warm-up)."""
        t0 = time.perf_counter()
        p = self.params
        self._population = population or p.population
        picked: dict[str, Candidate] = {}
        programs: set[str] = set()

        def take(c: Candidate) -> None:
            if c.key in picked or c.key in self.measured:
                return
            if c.program in programs or c.program in self.measured_programs:
                self.stats.twins += 1
                return
            picked[c.key] = c
            programs.add(c.program)

        seeds = self._seeds()
        if self.model.informed or seeds or foreign:  # else random scores would rank random programs: the top-up below
            with self._streamed():
                init = self.sample_initial(max(p.init_min_population, self._population - len(seeds)))
            pool = [c for c in init if c.key not in self.measured]
            n_random = min(int(p.eps_greedy * n), len(pool))
            random_pool = [pool[i] for i in self.rng.permutation(len(pool))[: 3 * n_random]]
            best = self._evolve(init + seeds + list(foreign), 2 * n)
            for c in foreign:
                if len(picked) >= min(n, FOREIGN_MEASURED_PER_ROUND):
                    break
                take(c)
            for c in best:
                if len(picked) >= n - n_random:
                    break
                take(c)
            for c in random_pool:
                if len(picked) >= n:
                    break
                take(c)
        if len(picked) < n:  # the evolution found too few new programs (or did not run): top up with random ones
            for c in self.sample_initial(2 * n):
                if len(picked) >= n:
                    break
                take(c)
        self.stats.seconds += time.perf_counter() - t0
        return list(picked.values())

    def _n_seeds(self) -> int:
        return min(int(self.params.init_measured_ratio * self._population), len(self._traced_measured()))

    def _traced_measured(self) -> list[tuple[float, Candidate]]:
        return [(cost, c) for cost, c in self.measured_candidates if c.decisions is not None and np.isfinite(cost)]

    def _seeds(self) -> list[Candidate]:
        """The fastest measured programs, to evolve from."""
        ranked = sorted(self._traced_measured(), key=lambda t: t[0])
        return [c for _, c in ranked[: self._n_seeds()]]

    def _evolve(self, population: list[Candidate], keep: int) -> list[Candidate]:
        """Genetic iterations: score, keep the best unmeasured programs seen, select parents by score, mutate."""
        p = self.params
        heap: list[tuple[float, int, Candidate]] = []
        in_heap: set[str] = set()
        counter = 0
        for it in range(p.num_iters + 1):
            if not population:
                break
            scores = self.score(population)
            for c, sc in zip(population, scores):
                if c.key in self.measured or c.key in in_heap or not np.isfinite(sc):
                    continue
                counter += 1
                item = (float(sc), counter, c)
                if len(heap) < keep:
                    heapq.heappush(heap, item)
                    in_heap.add(c.key)
                elif sc > heap[0][0]:
                    in_heap.discard(heapq.heappushpop(heap, item)[2].key)
                    in_heap.add(c.key)
            if it == p.num_iters:
                break
            with self._streamed():
                population = self._next_generation(population, scores)
        return [c for _, _, c in sorted(heap, key=lambda t: (-t[0], t[1]))]

    def _next_generation(self, population: list[Candidate], scores: np.ndarray) -> list[Candidate]:
        p = self.params
        finite = np.where(np.isfinite(scores), scores, np.nan)
        if np.all(np.isnan(finite)):
            return []
        lo = np.nanmin(finite)
        weights = np.nan_to_num(finite - lo, nan=0.0) + 1e-9
        probs = weights / weights.sum()
        out: list[Candidate] = []
        attempts = 0
        while len(out) < self._population and attempts < 3 * self._population:
            attempts += 1
            parent = population[int(self.rng.choice(len(population), p=probs))]
            if parent.decisions is None or self.rng.random() >= p.mutation_prob:
                out.append(parent)
                continue
            d = self.space.mutate(parent.sketch_index, parent.decisions, parent.state, self.rng)
            if d is None:
                continue
            try:
                c = self.candidate(parent.sketch_index, d)
            except InvalidProgram:
                self.stats.invalid += 1
                continue
            if not self.space.keeps(parent.sketch_index, c.state, parent.state):
                continue
            out.append(c)
            self._send_soon(c)
        return out

    # ------------------------------------------------------------------------------------------ results

    def record(self, cands: list[Candidate], costs: list[float]) -> None:
        for c, cost in zip(cands, costs):
            if c.key in self.measured:
                continue
            self.measured[c.key] = cost
            self.measured_candidates.append((cost, c))
            self.measured_programs.add(c.program)

    def features_of(self, c: Candidate) -> np.ndarray:
        return self.featurize([c])[0]

    def best_measured(self, k: int) -> list[Candidate]:
        """The `k` fastest programs measured that this search made (those with decisions), fastest first."""
        return [c for _, c in sorted(self._traced_measured(), key=lambda t: t[0])[:k]]

    # ------------------------------------------------------------------------------------------ siblings

    def translate(self, source: SearchPolicy, c: Candidate) -> Candidate | None:
        """Program `c` of the `source` task as a program of this task, or None where the two have no sketch of
        the same shape (`SketchShape`). Tasks that share their anchor stage but not their epilogue (ResNet's
        conv + bias + ReLU and conv + bias + residual add + ReLU on the same shapes) then start from each other's
        best tilings instead of each finding them alone."""
        if c.decisions is None:
            return None
        match = self._sibling_sketch(source, c.sketch_index)
        if match is None:
            return None
        mine, names = match
        moved = self.space.rename_stages(c.decisions, names.get)
        if moved is None:
            return None
        try:
            return self.candidate(mine, moved)
        except InvalidProgram:
            return None

    def _sibling_sketch(self, source: SearchPolicy, index: int) -> tuple[int, dict[str, str]] | None:
        """This task's sketch of the same shape as the source's sketch `index`, with the stage names mapped."""
        key = (id(source), index)
        if key not in self._siblings:
            theirs = source.sketch_shapes[index]
            self._siblings[key] = None
            for i, ours in enumerate(self.sketch_shapes):
                if ours.signature == theirs.signature:
                    self._siblings[key] = (i, dict(zip(theirs.stages, ours.stages)))
                    break
        return self._siblings[key]

    @functools.cached_property
    def sketch_shapes(self) -> list[SketchShape]:
        return [SketchShape.of(sk) for sk in self.sketches]

    def has_sibling_sketch(self, source: SearchPolicy) -> bool:
        """Whether some sketch of `source` has the shape of one of this task's."""
        return any(self._sibling_sketch(source, i) is not None for i in range(len(source.sketches)))

    @property
    def best_cost(self) -> float:
        return min(self.measured.values(), default=float("inf"))


@dataclass(frozen=True)
class SketchShape:
    """What a sketch's decisions refer to, without the task's names: its stages that are not inlined, in order,
    each by tag and shape; its tile extents and the number of lengths of each tile split; and its non-inlining
    rules with stage names masked. Two sketches of equal signature take each other's decisions once `stages`
    (the names, in the same order) are mapped."""

    stages: tuple[str, ...]
    signature: tuple

    @staticmethod
    def of(sketch) -> SketchShape:
        state = sketch.state
        kept = [st for st in state.stages if not st.op.is_placeholder and st.compute_at != "inline"]
        names = sorted((st.name for st in state.stages), key=len, reverse=True)
        # whole names only: a stage "a" must not mask the "a" in "pack"
        alternatives = "|".join(re.escape(n) for n in names)
        mask = re.compile(rf"(?<![\w.])(?:{alternatives})(?![\w.])") if names else None

        def masked(rule: str) -> str:
            return mask.sub("*", rule) if mask else rule

        rules = tuple(masked(r) for r in sketch.rules if not r.startswith("inline("))
        lengths = tuple(len(cast(Split, state.steps[i]).lengths) for i in sketch.tile_steps)
        signature = (
            tuple((st.op.tag, tuple(st.op.shape), st.op.dtype) for st in kept),
            sketch.tile_extents,
            lengths,
            rules,
        )
        return SketchShape(tuple(st.name for st in kept), signature)


def program_identity(state: State) -> str:
    """A digest of the loop nest `state` lowers to (before simplification) and its unroll pragmas: equal for
    decisions that make the same program. A program that does not lower is its own identity (its step list)."""
    try:
        text = str(lower(state, simplify=False))
    except TilefarmError:
        return program_key(state)
    unroll = sorted((st.name, st.auto_unroll_max_step) for st in state.stages if st.auto_unroll_max_step)
    return hashlib.sha1(f"{text}\n{unroll}".encode()).hexdigest()


# ---------------------------------------------------------------------------------------------- feature workers

_POOL: concurrent.futures.ProcessPoolExecutor | None = None


def _pool(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """Lowering and featurizing is pure Python, so the search spreads it over processes (forkserver: the parent
    has LLVM and XGBoost threads, which fork does not copy safely). Programs travel as step lists."""
    global _POOL
    if _POOL is None:
        ctx = multiprocessing.get_context("forkserver")
        _POOL = concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_exit_with, initargs=(os.getpid(),)
        )
        atexit.register(_POOL.shutdown, cancel_futures=True)
    return _POOL


PARENT_POLL_S = 1.0  # where the kernel has no pidfd_open: how often a feature worker checks that its tuner lives


def _exit_with(tuner: int) -> None:
    """A feature worker's initializer: exit as soon as the tuning process `tuner` is gone. A killed tuner (SIGTERM,
    SIGKILL, a Ctrl-C that ends it before atexit) left its workers behind for good, 400 MB each: a worker waits on the
    pool's call queue, whose write end it holds itself, so it never reads an end of file, and the forkserver they
    came from waits for them. A daemon thread waits on a pidfd of the tuner (polls without one)."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(tuner)
            select.select([fd], [], [])
        except (AttributeError, OSError):  # no pidfd_open here, or the tuner already gone
            while True:
                try:
                    os.kill(tuner, 0)
                except ProcessLookupError:
                    break
                except PermissionError:  # alive, another user's (a reused pid): not ours to outlive
                    break
                time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="tilefarm-tuner-watch").start()
    # a Ctrl-C reaches the whole process group: the tuner stops (and these with it), a worker prints no traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _drop_pool() -> None:
    global _POOL
    _POOL = None


def _submit_features(dag: ComputeDAG, programs: list[tuple], workers: int) -> concurrent.futures.Future | None:
    """A job featurizing `programs` in a worker; None if the pool is broken (the caller computes them itself)."""
    try:
        return _pool(workers).submit(_featurize_chunk, dag, programs)
    except concurrent.futures.process.BrokenProcessPool:
        _drop_pool()
        return None


def _split(items: list, workers: int) -> list[list]:
    """`items` in at most `workers` consecutive parts of equal size (the last shorter), one job per worker."""
    chunk = -(-len(items) // workers)
    return [items[i : i + chunk] for i in range(0, len(items), chunk)] if items else []


def _featurize_in_pool(dag: ComputeDAG, programs: list[tuple], workers: int) -> list[np.ndarray]:
    """Features of `programs`, split over the workers; computed here if the pool is broken."""
    try:
        jobs = [_pool(workers).submit(_featurize_chunk, dag, part) for part in _split(programs, workers)]
        return [x for job in jobs for x in job.result()]
    except concurrent.futures.process.BrokenProcessPool:
        _drop_pool()
        return _featurize_chunk(dag, programs)


def featurize_programs(dag: ComputeDAG, programs: list[tuple], target: Target) -> list[np.ndarray]:
    """Features of many step lists of one DAG (pre-training on stored records): over a process per core when
    there are enough of them to pay for the trip."""
    if len(programs) >= PARALLEL_FEATURES_MIN and target.cores > 1:
        return _featurize_in_pool(dag, programs, target.cores)
    return _featurize_chunk(dag, programs)


def _featurize_chunk(dag: ComputeDAG, programs: list[tuple]) -> list[np.ndarray]:
    return [_features_of_steps(dag, steps) for steps in programs]


def _features_of_steps(dag: ComputeDAG, steps: tuple) -> np.ndarray:
    """Features of a step list; none (0 rows) for one that does not replay (a record of another tilefarm)."""
    try:
        state = apply_steps(dag, steps)
    except TilefarmError:
        return np.zeros((0, features.N_FEATURES), np.float32)
    return features.extract(state)


__all__ = ["SearchPolicy", "SearchParams", "Candidate", "SearchStats", "featurize_programs", "program_identity"]
