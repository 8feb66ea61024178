"""Kernels timed inside the whole model: what the tuner's estimate is confirmed against.

The tuner times each task alone, its inputs and weights as the runner leaves them (warm, or the weights flushed), and
estimates the model as Σ calls x best latency. A run of the model meets each kernel in another state: its input was
just written by the producer (in cache, or evicted by a large one), its weights were last read a whole run ago, and
the calls themselves cost something. On MobileNetV2 (Zen 5, 1 thread, default schedules) the kernels timed alone sum
to 3.15 ms, timed in the run to 3.60, and the run takes 3.86: an estimate from the first misses by 18%.

`time_in_model` compiles the graph with the records a compile would apply, runs it, and times every call inside whole
runs of the plan (`Artifact.profile`'s `in_run`) and the run itself. The task scheduler turns that into a factor per
task (its in-run time over its tuned time) and the run's overhead beyond the calls, so its estimate and its choice of
the next task to tune follow the model's run rather than the kernels' own timings.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from compiler.artifact.build import build
from compiler.artifact.runtime import Artifact
from compiler.base.target import Target
from compiler.costs.records import Database, as_tuples
from compiler.model.graph import Graph

REPEAT = 10  # runs of the plan each call is timed in (medians)
RUN_SAMPLES, SAMPLE_S = 7, 0.05  # the run: the median of 7 samples, each the mean of back-to-back runs filling 50 ms
# a pause before timing, as bench.kernels pauses between systems: the tuner has just trained its XGBoost model, whose
# OpenMP threads may still spin on the cores the model's run wants
SETTLE_S = 0.2
ROUND_GAP_S = 1.0  # seconds between rounds of one timing (`rounds`): the fastest round counts


@dataclass(frozen=True)
class ModelTiming:
    """A compiled model's run (median seconds) and, per task key, the median seconds of one call inside runs of the
    plan (the mean over the task's calls where it has several), and the program those calls ran."""

    run_s: float
    per_call: dict[str, float]
    calls: dict[str, int]
    programs: dict[str, tuple] = field(default_factory=dict)  # task key -> the steps of the program its calls ran

    @property
    def overhead_s(self) -> float:
        """What the run costs beyond its calls' in-run times: the entry's own work and threads waking, less what
        timing each call from Python adds to it (a microsecond or two per call: a model of many short calls, such as
        MobileNetV2's 55 at 1 thread, comes out slightly negative)."""
        return self.run_s - sum(self.calls[k] * s for k, s in self.per_call.items())


def time_in_model(
    graph: Graph,
    records: Database | None,
    target: Target | None = None,
    threads: int | None = None,
    repeat: int = REPEAT,
    disabled_passes: Collection[str] = (),
    rounds: int = 1,
) -> ModelTiming:
    """Compile `graph` with the best record per task from `records` (as `tilefarm compile` would) and time it on this
    host at `threads` (default: the artifact's own default), on seeded random inputs (zeros for integer inputs, which
    index tables).

    With `rounds` above 1 the model is timed that many times, ROUND_GAP_S apart, and the fastest round counts. At 2
    threads on a 2-vCPU host a run waits at every kernel for both threads, so anything else that wakes on either core
    for a moment (the tuner's own worker processes, another job) stretches the whole run: one timing at the end of a
    MobileNetV2 tuning (Zen 4) read 5.52 ms where the timings before it read 3.66 and 3.86 ms and a fresh process
    3.90. Such interference only ever adds time, so the fastest of rounds spread over a few seconds is the run a
    quiet host gives."""
    with tempfile.TemporaryDirectory(prefix="tilefarm-in-model-") as tmp:
        path = Path(tmp) / "model.tar"
        build(graph, path, name="in_model", records=records, disabled_passes=disabled_passes, target=target)
        art = Artifact.load(path)
        feeds = _inputs(art.meta["inputs"])
        before = os.environ.get("TILEFARM_NUM_THREADS")
        if threads:
            os.environ["TILEFARM_NUM_THREADS"] = str(threads)
        try:
            timings = []
            for k in range(rounds):
                time.sleep(SETTLE_S if k == 0 else ROUND_GAP_S)
                timings.append(_time_round(art, feeds, repeat))
        finally:
            if threads:
                _restore("TILEFARM_NUM_THREADS", before)
    programs = {t["key"]: as_tuples(t["steps"]) for t in art.meta["tasks"] if "steps" in t}
    return replace(min(timings, key=lambda t: t.run_s), programs=programs)


def _time_round(art: Artifact, feeds: dict[str, np.ndarray], repeat: int) -> ModelTiming:
    """One timing of the loaded model: its calls inside runs of the plan, then the run itself. Python's garbage
    collector is held off meanwhile: inside a tuning process, whose heap holds the search's many programs, a full
    collection triggered by a run's few allocations would be charged to that run; a fresh process running the
    model has no such heap."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        rows = art.profile(feeds, repeat)
        runs = [_sample(lambda: art.run(feeds)) for _ in range(RUN_SAMPLES)]
    finally:
        if collecting:
            gc.enable()
    seconds: dict[str, list[float]] = {}
    for row in rows:
        seconds.setdefault(row["task"], []).append(row["in_run"])
    return ModelTiming(
        statistics.median(runs),
        {k: sum(v) / len(v) for k, v in seconds.items()},
        {k: len(v) for k, v in seconds.items()},
    )


def _sample(run) -> float:
    """Seconds per run over back-to-back runs filling SAMPLE_S (one at least), as bench.kernels samples. Timed as the
    median of 10 single runs, a 2-thread ResNet-18 came out at 6.8, 8.1 and 7.4 ms at three points of one tuning
    (Zen 5), and its fresh-process benchmark at 7.84 ms: single runs of a few milliseconds on a 2-vCPU host vary by
    more than the 5% the estimate is held to."""
    calls, t = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - t < SAMPLE_S:
        run()
        calls += 1
    return (time.perf_counter() - t) / calls


def _inputs(specs: list[dict]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in specs:
        dtype = np.dtype(spec["dtype"])
        if dtype.kind == "f":
            feeds[spec["name"]] = rng.standard_normal(spec["shape"]).astype(dtype)
        else:
            feeds[spec["name"]] = np.zeros(spec["shape"], dtype)
    return feeds


def _restore(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value
