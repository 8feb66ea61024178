"""What a trial budget buys a model before any tuning: each task's first round (the warm-up), and which tasks a budget
too small for every first round leaves unmeasured. The command line and the service word it their own way; the
numbers are these, so both say the same thing."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WARMUP_MIN = 16  # the smallest first round of a task


def first_round_size(per_round: int, work: float, most_work: float) -> int:
    """Trials of a task's first round: Ansor's warm-up measures a full round of every task; here the round shrinks
    with the task's share of the model's weighted FLOPs (`work` = calls x FLOPs, against the largest task's), down to
    WARMUP_MIN, so pooling, adds and 1x1 downsampling do not spend a model's budget before the gradient rule can send
    it where the time is."""
    share = work / most_work if most_work else 1.0
    return max(min(WARMUP_MIN, per_round), min(per_round, math.ceil(per_round * share)))


def first_round_sizes(per_round: int, works: Sequence[float]) -> list[int]:
    """`first_round_size` of each task, given every task's calls x FLOPs."""
    most = max(works, default=0)
    return [first_round_size(per_round, w, most) for w in works]


@dataclass(frozen=True)
class Shortfall:
    """A budget that does not reach every task's first round: the trials one round per task takes (`need`), the
    tasks to measure (`tasks`, `forms` of them other forms of a conv) and how many the budget reaches (`reached`, in
    order)."""

    budget: int
    need: int
    tasks: int
    forms: int
    reached: int


def shortfall(first_rounds: Sequence[int], weights: Sequence[int], budget: int) -> Shortfall | None:
    """The Shortfall of `budget`, or None when it gives every task to measure a round (a short last one counts).
    `first_rounds`: per task the trials of its first round (0: measured already); `weights`: its calls in the model
    (0: another form of a conv, compiled only where faster)."""
    need = sum(first_rounds)
    if budget >= need:
        return None
    left, reached = budget, 0
    for n in first_rounds:
        if n and left > 0:
            reached += 1
            left -= n
    todo = [w for n, w in zip(first_rounds, weights) if n]
    if reached == len(todo):
        return None
    return Shortfall(budget, need, len(todo), sum(1 for w in todo if not w), reached)
