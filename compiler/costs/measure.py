"""Measuring candidate schedules, target-neutral: what a candidate is (`MeasureInput`), what building and running it
gives (`BuildResult`, `MeasureResult`), the `Builder` and `Runner` protocols a target's measurer implements, and the
error codes of a failed measurement. `measure(inputs, builder, runner)` does both; `to_record` turns a result into a
TuningRecord.

Failures are results, never exceptions: `MeasureResult.error` is one of ERRORS.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from compiler.base.target import Target
from compiler.costs.records import WARM, TuningRecord, as_tuples, target_name
from compiler.schedule.state import Step
from compiler.tensor.tasks import Task

# error codes (TuningRecord.error)
INSTANTIATION = "instantiation"  # the steps do not replay on the task's DAG
BUILD = "build"  # lowering, code generation or linking failed (or the build process died)
BUILD_TIMEOUT = "build_timeout"
RUN = "run"  # the kernel crashed the sandbox (segfault, abort, …) or its library could not be loaded
RUN_TIMEOUT = "run_timeout"  # no answer within the runner's timeout: the kernel hangs or is far too slow
WRONG_ANSWER = "wrong_answer"  # the outputs differ from the default schedule's
UNKNOWN = "unknown"  # anything else (the reference itself failed, a bug in the measuring code)
# the errors that are the program's own: a program measured once without error that ends in one of these when it is
# measured again (the task scheduler's confirmations and re-timing) was lucky the first time. The others (a build that
# timed out on a busy host, a lost farm batch) say nothing about the program, and its first timings stand.
PROGRAM_FAULTS = frozenset({RUN, RUN_TIMEOUT, WRONG_ANSWER})
ERRORS = (INSTANTIATION, BUILD, BUILD_TIMEOUT, RUN, RUN_TIMEOUT, WRONG_ANSWER, UNKNOWN)


@dataclass(frozen=True)
class MeasureInput:
    task: Task
    steps: tuple[Step, ...]
    trace: dict | None = None  # how the search made it (kept with the record; a remote runner sends it along)


@dataclass(frozen=True)
class BuildResult:
    path: str | None  # the shared library, None when the build failed
    error: str | None
    message: str
    seconds: float


@dataclass(frozen=True)
class MeasureResult:
    costs: tuple[float, ...]  # seconds per kernel call, one mean per repeat
    error: str | None
    message: str
    build_seconds: float
    run_seconds: float
    timestamp: float = field(default_factory=time.time)
    cache: str = WARM  # the cache condition the costs were timed in (compiler.costs.records.CACHE_CONDITIONS)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.costs)

    @property
    def mean_cost(self) -> float:
        return sum(self.costs) / len(self.costs) if self.ok else math.inf


class Builder(Protocol):
    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        """One result per input, in order; failures are results, not exceptions."""
        ...


class Runner(Protocol):
    @property
    def cache(self) -> str:
        """The cache condition it times candidates in (compiler.costs.records.CACHE_CONDITIONS)."""
        ...

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        """One result per input; a failed build passes its error through."""
        ...


def measure(inputs: list[MeasureInput], builder: Builder, runner: Runner) -> list[MeasureResult]:
    """Build and run `inputs`; the built libraries are deleted afterwards."""
    builds = builder.build(inputs)
    try:
        return runner.run(inputs, builds)
    finally:
        for b in builds:
            if b.path:
                Path(b.path).unlink(missing_ok=True)


def to_record(inp: MeasureInput, res: MeasureResult, target: Target) -> TuningRecord:
    return TuningRecord(
        workload_key=inp.task.key,
        target=target_name(target),
        host=target.fingerprint(),
        steps=tuple(as_tuples(s.record()) for s in inp.steps),  # tuples, as TuningRecord.from_json reads them
        costs=tuple(res.costs),
        error=res.error,
        error_message=res.message,
        timestamp=res.timestamp,
        trace=inp.trace,
        cache=res.cache,
    )
