"""What a long command shows while it works: the tuner's bar and per-task table refreshed in place (on a terminal) or
a plain line per round (a log, CI); compile's phases; a download's bytes. On a terminal it is drawn with rich."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.progress_bar import ProgressBar
from rich.table import Table

from compiler.search.budget import shortfall

TABLE_EVERY = 10  # plain output: the whole per-task table every this many rounds, a line for the others


def console(stream: TextIO | None = None) -> Console:
    return Console(file=stream or sys.stdout, highlight=False, soft_wrap=False)


def redraws(con: Console) -> bool:
    """Whether output can be redrawn in place: a terminal that understands cursor movement, not a file, a pipe or
    TERM=dumb (FORCE_COLOR colours a pipe for rich, but a log must not fill with redrawn frames); TTY_INTERACTIVE=1
    or 0 decides it, as it does for rich."""
    isatty = getattr(con.file, "isatty", None)
    forced = os.environ.get("TTY_INTERACTIVE") == "1"
    return con.is_interactive and (forced or bool(isatty and isatty()))


def clock(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


# ---------------------------------------------------------------------------------------------------------- tune


class TuneProgress:
    """The TaskScheduler's callback, called after every round: trials done of the budget, elapsed time, ETA, the
    current estimate of the model's latency and the per-task table. On a terminal they are redrawn in place (and the
    clock ticks between rounds); elsewhere each round is one line starting `round N:`, with the whole table every
    TABLE_EVERY rounds. Used as a context manager around the scheduler's run."""

    def __init__(self, budget: int, time_budget: float | None = None, stream: TextIO | None = None):
        self.con = console(stream)
        self.live = redraws(self.con)
        self.budget, self.time_budget = budget, time_budget
        self.start = time.monotonic()
        self.rounds = self.trials = 0
        self.estimate = math.inf
        self.rows: list[tuple] = []  # a snapshot per round: the renderer runs on rich's refresh thread
        self.unmeasured: int | None = None  # tasks without a measured program; None before the first round
        self._live: Live | None = None

    def __enter__(self) -> TuneProgress:
        self.start = time.monotonic()
        if self.live:
            # transient: the command prints the final table itself, the same on a terminal and in a log
            self._live = Live(self, console=self.con, refresh_per_second=4, transient=True)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()

    def __call__(self, sched) -> None:
        self.rounds += 1
        self.trials = sched.stats.trials
        self.estimate = sched.estimated_latency
        self.unmeasured = sum(1 for p in sched.progress if not math.isfinite(p.best))
        self.rows = [
            (k, p.task.name, p.task.flop_count / 1e6, sched.calls(k), p.gflops, p.best * 1e3, p.trials, p.done)
            for k, p in enumerate(sched.progress)
        ]
        if self._live is not None:
            self._live.refresh()
            return
        line = f"round {self.rounds}: {self.trials}/{self.budget} trials, elapsed {clock(self.elapsed)}, "
        print(f"{line}ETA {clock(self.eta)}, {self.estimate_text}", file=self.con.file, flush=True)
        if self.rounds % TABLE_EVERY == 0:
            print(sched.table(), file=self.con.file, flush=True)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def eta(self) -> float | None:
        """Seconds left at this run's pace of trials (never past a --time-budget); None before the first round."""
        if not self.trials:
            return None
        left = self.elapsed / self.trials * max(self.budget - self.trials, 0)
        return min(left, self.time_budget - self.elapsed) if self.time_budget else left

    @property
    def estimate_text(self) -> str:
        if math.isfinite(self.estimate):
            return f"best estimate {self.estimate * 1e3:.3f} ms"
        return "best estimate: none yet" + (f" ({self.unmeasured} tasks unmeasured)" if self.unmeasured else "")

    def __rich__(self) -> Group:
        head = Table.grid(padding=(0, 1))
        eta = "re-timing the fastest" if self.trials >= self.budget else f"ETA {clock(self.eta)}"
        head.add_row(
            "tuning",
            ProgressBar(total=self.budget, completed=self.trials, width=30),
            f"{self.trials}/{self.budget} trials",
            f"elapsed {clock(self.elapsed)}",
            eta,
            self.estimate_text,
        )
        table = Table(box=None, padding=(0, 1), header_style="bold")
        for name in ("ID", "task", "MFLOP", "weight", "GFLOP/s", "latency ms", "trials", "done"):
            table.add_column(name, justify="left" if name == "task" else "right")
        for k, name, mflop, calls, gflops, ms, trials, done in self.rows:
            latency = f"{ms:.4f}" if math.isfinite(ms) else "-"
            table.add_row(str(k), name[:28], f"{mflop:.2f}", str(calls), f"{gflops:.2f}", latency, str(trials),
                          "yes" if done else "")  # fmt: skip
        return Group(head, table)


def budget_note(first_rounds: Sequence[int], weights: Sequence[int], budget: int) -> str | None:
    """What a trial budget too small to give every task its first round leaves out, said before tuning starts: the
    trials one round per task takes, which tasks the budget reaches (the warm-up measures them in order) and what
    becomes of the others. None when the budget covers them. `first_rounds`: per task the trials of its first round
    (0: measured already); `weights`: its calls in the model (0: another form of a conv, compiled only if faster)."""
    short = shortfall(first_rounds, weights, budget)
    if short is None:
        return None
    need, reached, forms, todo = short.need, short.reached, short.forms, short.tasks
    of = f" ({todo - forms} of the model's, {forms} other forms of its convs)" if forms else ""
    lost = "keeps its default schedule when compiled" + (", a conv form never measured is not taken" if forms else "")
    return (
        f"note: {budget} trials do not give every task its first round: one round for each of the {todo} tasks "
        f"to measure{of} takes {need} trials. With {budget}, about {reached} task{'s are' if reached > 1 else ' is'} "
        f"measured (in the table's order) and {todo - reached} not: a task never measured {lost}, and there is "
        f"no end-to-end estimate. --trials {need} or more gives every task a round, and the rest of the budget goes "
        "to the tasks where the most time can be won."
    )


def estimate_line(sched, budget: int, time_budget: float | None = None) -> str:
    """A finished tune's estimate of the model's latency, or why there is none (and what gives one)."""
    est = sched.estimated_latency
    if math.isfinite(est):
        return f"estimated end-to-end latency {est * 1e3:.3f} ms (the sum over tasks of calls x best latency)"
    missing = [p for p in sched.progress if p.task.weight and not math.isfinite(p.best)]
    never = [p for p in missing if p.trials == 0]
    failed = [p for p in missing if p.trials]
    why = []
    if never:
        ran_out = "the time budget" if time_budget and sched.stats.trials < budget else f"the {budget} trials"
        why.append(f"{len(never)} of the model's tasks were never measured ({ran_out} ran out before their first one)")
    if failed:
        why.append(f"no program of {len(failed)} tasks ran ({', '.join(p.task.name for p in failed[:3])}"
                   + (", ..." if len(failed) > 3 else "") + "; see the errors above)")  # fmt: skip
    first = sum(sched.first_round_trials())
    hint = f"; tune on with --resume --trials {first} to give each its first round" if never and first else ""
    return f"no end-to-end estimate: {'; '.join(why)}. Those tasks compile with their default schedules{hint}"


# ---------------------------------------------------------------------------------------------------------- phases


class Phases:
    """A command's phases, called with each phase's name as it starts: every finished phase is one line with its
    seconds; on a terminal the running one shows beside a spinner. A context manager: leaving it ends the last."""

    def __init__(self, stream: TextIO | None = None):
        self.con = console(stream)
        self.name: str | None = None
        self.t0 = 0.0
        self.times: dict[str, float] = {}
        self._status = None

    def __enter__(self) -> Phases:
        if redraws(self.con):
            self._status = self.con.status("")
            self._status.start()
        return self

    def __exit__(self, *exc) -> None:
        self._end(ok=exc[0] is None)
        if self._status is not None:
            self._status.stop()

    def __call__(self, name: str) -> None:
        self._end()
        self.name, self.t0 = name, time.perf_counter()
        if self._status is not None:
            self._status.update(f"{name} ...")

    def _end(self, ok: bool = True) -> None:
        if self.name is None:
            return
        seconds = time.perf_counter() - self.t0
        self.times[self.name] = seconds
        if ok:
            self.con.print(f"  {self.name}: {seconds:.1f} s", markup=False)
        self.name = None


# ---------------------------------------------------------------------------------------------------------- bytes

PLAIN_EVERY_S = 2.0  # plain output: a line about a download at most this often


@contextmanager
def download_progress(what: str, stream: TextIO | None = None) -> Iterator[Callable[[int, int | None], None]]:
    """A callback for (bytes so far, total or None) as a download goes: on a terminal a bar with bytes and speed,
    elsewhere a line every PLAIN_EVERY_S seconds (a short download prints none)."""
    con = console(stream)
    if redraws(con):
        columns = (TextColumn(what), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=con, transient=True) as bar:
            task = bar.add_task(what, total=None)

            def show(done: int, total: int | None) -> None:
                bar.update(task, completed=done, total=total)

            yield show
        return
    last = [time.monotonic()]

    def line(done: int, total: int | None) -> None:
        if time.monotonic() - last[0] >= PLAIN_EVERY_S:
            last[0] = time.monotonic()
            of = f" of {total / 2**20:.1f} MiB" if total else ""
            print(f"{what}: {done / 2**20:.1f} MiB{of}", file=con.file, flush=True)

    yield line
