"""The compiler's Builder/Runner protocols over Celery: a tuning job's batches are built and run by the workers of
the job's host class, through its measure queue.

`FarmBuilder.build` defers (the measuring worker builds, on the machine whose code it is); `FarmRunner.run` sends
a batch as one `tilefarm.measure_batch` message, records it as a MeasureBatch row, and waits for the result.
A batch is lost when the worker that took it stops heartbeating (or restarted), when a worker of its queue that may
have prefetched it died before it started, when it runs past its deadline, or when its task failed: it is then
sent again under a new task id (the old one revoked, and skipped by any worker that still receives it), up to
settings.batch_tries times; after that its candidates come back as "unknown" errors. Measuring one batch twice is
harmless: record commits are idempotent.

Outages (workers.outage): every database and broker call of the runner waits out an outage instead of failing the
job. A batch no worker had started when the broker went away is sent again once it is back (a Redis that keeps
nothing lost the message; a duplicate of one it kept is skipped), and so is a batch its worker finished whose result
never came (lost with the broker). After a database outage, workers' heartbeats are stale through no fault of
theirs: no batch is judged lost for a grace period."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta

from compiler.costs.measure import UNKNOWN, BuildResult, MeasureInput, MeasureResult
from compiler.costs.records import WARM, cache_condition
from compiler.tensor import dag_json
from compiler.tensor.tasks import Task
from server.settings import Settings
from workers import progress
from workers.celery_app import MEASURE_BATCH
from workers.outage import DATABASE_DOWN, patiently

log = logging.getLogger("tilefarm.workers")

POLL_S = 0.2  # how often the result is looked at
CHECK_S = 1.0  # how often the database is asked whether the batch is lost or the job must stop
DEADLINE_SLACK_S = 60.0  # on top of the per-candidate timeouts: the reference outputs of a new task, commits
RESULT_GRACE_S = 15.0  # a batch its worker finished whose result has not come by then was lost with the broker


class JobInterrupted(Exception):
    """The search must stop: "cancelled" (asked to), "stale" (another attempt owns the job), "shutdown" (the
    worker is stopping: the job goes back to the queue)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


NEWER_OPTIONS = {"cold_constants": False}  # RunnerOptions fields a measuring worker may not know, with their defaults


@dataclass(frozen=True)
class RunnerOptions:
    """How the measuring worker builds and times candidates (compiler.targets.cpu.runner.LocalBuilder / LocalRunner)."""

    build_timeout: float = 15.0
    timeout: float = 10.0
    number: int = 3
    repeat: int = 1
    min_repeat_ms: float = 100
    cache_flush: bool = False
    threads: int | None = None
    cold_constants: bool = False  # flush the task's constant inputs (the model's weights) before each timed call

    @property
    def cache(self) -> str:
        return cache_condition(self.cache_flush, self.cold_constants)

    def wire(self) -> dict:
        """The options as a batch carries them; options newer than the farm's first version are sent only when they
        are on, so a measuring worker of an earlier version (which refuses options it does not know) still measures
        every batch that does not need them."""
        return {k: v for k, v in asdict(self).items() if k not in NEWER_OPTIONS or v != NEWER_OPTIONS[k]}

    def deadline(self, size: int) -> float:
        """Seconds a batch of `size` may run: every candidate at its build and run timeouts, one after another."""
        return size * (self.build_timeout + self.timeout) + DEADLINE_SLACK_S


class FarmBuilder:
    """Builds nothing here: the worker that runs a batch builds it, for its own CPU."""

    def build(self, inputs: list[MeasureInput]) -> list[BuildResult]:
        return [BuildResult(None, None, "built by the measuring worker", 0.0) for _ in inputs]


class FarmRunner:
    """Sends batches to a job's measure queue and waits for them (see the module docstring).

    `interrupted` is asked every CHECK_S while waiting; a reason it returns raises JobInterrupted, except that a
    cancelled job whose batch a worker has started waits for that batch: the worker stores its records whatever the
    job does, and the round that counts them ends the job (a batch not started yet is given up at once)."""

    def __init__(
        self,
        settings: Settings,
        app,
        *,
        job_id: int | None,
        queue: str,
        host: str,
        positions: dict[str, int] | None = None,
        options: RunnerOptions | None = None,
        interrupted: Callable[[], str | None] = lambda: None,
        stopping: Callable[[], bool] = lambda: False,
    ):
        self.settings, self.app = settings, app
        self.job_id, self.queue, self.host = job_id, queue, host
        self.positions = positions or {}
        self.options = options or RunnerOptions()
        self.interrupted = interrupted
        self.stopping = stopping  # the worker is going away: an outage is not waited out
        self._dags: dict[str, str] = {}
        self._broker_down = False  # the broker failed a call while the current batch was in flight
        self._judge_after = 0.0  # monotonic time before which no batch is judged lost (after a database outage)

    def _db(self, what: str, call):
        def outage(e: BaseException) -> None:
            self._judge_after = time.monotonic() + self.settings.worker_grace_s + 2 * self.settings.heartbeat_s

        return patiently(self.settings, f"job {self.job_id}: {what}", call, stop=self.stopping, on_outage=outage)

    def _broker(self, what: str, call):
        def outage(e: BaseException) -> None:
            if isinstance(e, DATABASE_DOWN):  # the result backend's calls never reach the database
                return
            self._broker_down = True

        return patiently(self.settings, f"job {self.job_id}: {what}", call, stop=self.stopping, on_outage=outage)

    @property
    def cache(self) -> str:
        return self.options.cache

    def run(self, inputs: list[MeasureInput], builds: list[BuildResult]) -> list[MeasureResult]:
        results: list[MeasureResult | None] = [None] * len(inputs)
        by_task: dict[str, list[int]] = {}
        for i, inp in enumerate(inputs):
            by_task.setdefault(inp.task.key, []).append(i)
        for idx in by_task.values():
            for i, r in zip(idx, self._run_batch(inputs[idx[0]].task, [inputs[i] for i in idx])):
                results[i] = r
        return results  # type: ignore[return-value]

    def _run_batch(self, task: Task, inputs: list[MeasureInput]) -> list[MeasureResult]:
        if task.key not in self._dags:
            self._dags[task.key] = dag_json.to_json(task.dag)
        payload = {
            "job_id": self.job_id,
            "task": self.positions.get(task.key),
            "workload_key": task.key,
            "name": task.name,
            "dag": self._dags[task.key],
            "constants": list(task.constants),
            "host": self.host,
            "candidates": [{"steps": [s.record() for s in inp.steps], "trace": inp.trace} for inp in inputs],
            "options": self.options.wire(),
        }
        tries = self.settings.batch_tries
        why = "never sent"
        for try_number in range(1, tries + 1):
            outcome = self._send_and_wait(payload, len(inputs), try_number)
            if not isinstance(outcome, str):
                return outcome
            why = outcome
            log.warning("job %s: batch of %s lost (try %d/%d): %s", self.job_id, task.name, try_number, tries, why)
        message = f"measurement batch lost {tries} times (last: {why})"
        return [MeasureResult((), UNKNOWN, message, 0.0, 0.0, cache=self.cache) for _ in inputs]

    def _send_and_wait(self, payload: dict, size: int, try_number: int) -> list[MeasureResult] | str:
        """The batch's results, or why it was lost."""
        batch_id = str(uuid.uuid4())
        s = self.settings
        sent = (batch_id, self.job_id, payload["task"], size, self.queue, try_number)
        self._db("recording a batch", lambda: progress.batch_sent(s, *sent))
        self._broker(
            "sending a batch",
            lambda: self.app.send_task(MEASURE_BATCH, args=(payload,), queue=self.queue, task_id=batch_id),
        )
        self._broker_down = False  # sent: from now on, an outage may lose the message
        result = self.app.AsyncResult(batch_id)
        deadline = self.options.deadline(size)
        next_check = time.monotonic() + CHECK_S
        finishing = False  # the job was cancelled while a worker measured this batch
        while True:
            state = self._broker("waiting for a batch", lambda: result.state)
            if state == "SUCCESS":
                value = self._broker("reading a result", lambda: result.result)
                self._forget(result)
                if isinstance(value, dict) and "results" in value:
                    return [_result(r) for r in value["results"]]
                return "the worker skipped it (it had been given up)"
            if state == "FAILURE":
                why = f"its task failed: {_one_line(result.result)}"
                self._forget(result)
                self._db("ending a batch", lambda w=why: progress.batch_ended(s, batch_id, "failed", {"failure": w}))
                return why
            if time.monotonic() >= next_check:
                reason = None if finishing else self._db("checking in", self.interrupted)
                if reason == "cancelled" and not self._db(
                    "giving up a batch", lambda: progress.batch_cancelled(s, batch_id)
                ):
                    finishing = True  # running: its records are being stored, so its round must count them
                elif reason:
                    raise JobInterrupted(reason)
                lost = self._lost(batch_id, deadline)
                if lost:
                    self._db("ending a batch", lambda w=lost: progress.batch_ended(s, batch_id, "lost", {"lost": w}))
                    self._revoke(batch_id)
                    self._forget(result)
                    return lost
                next_check = time.monotonic() + CHECK_S
            time.sleep(POLL_S)

    def _forget(self, result) -> None:
        try:
            result.forget()
        except Exception as e:  # a result left behind expires with result_expires
            log.warning("could not delete the result of batch %s: %s", result.id, _one_line(e))

    def _lost(self, batch_id: str, deadline: float) -> str | None:
        view = self._db("checking a batch", lambda: progress.batch_view(self.settings, batch_id))
        if view is None:
            return "its row disappeared"
        if view.state == "lost":
            return "its worker restarted while it held it"
        if self._broker_down and view.state == "sent":
            return "the broker went away before a worker took it (the message may be lost)"
        if view.state == "done" and view.finished_at is not None:
            grace = 0 if self._broker_down else RESULT_GRACE_S  # a worker sends its result right after the mark
            if progress.now() - view.finished_at > timedelta(seconds=grace + CHECK_S):
                return "its worker finished it, but its result never came (lost with the broker)"
        if time.monotonic() < self._judge_after:
            return None  # heartbeats could not be written during the database outage: judge none by them yet
        now = progress.now()
        grace = self.settings.worker_grace_s
        if view.worker is not None:
            w = view.workers.get(view.worker)
            if not progress.alive(w, self.settings, now):
                return f"its worker {view.worker} stopped answering"
            assert w is not None
            if view.started_at is not None and progress.aware(w.started_at) > view.started_at:
                return f"its worker {view.worker} restarted"
            if view.state == "running" and view.started_at and now - view.started_at > timedelta(seconds=deadline):
                return f"no result within {deadline:.0f} s of its start"
            return None
        # not started: a worker of the queue that died since it was sent may have prefetched it (that message is
        # gone with the file-system broker, and back only after Redis's visibility timeout)
        for w in view.workers.values():
            was_alive = progress.aware(w.last_heartbeat) >= view.sent_at - timedelta(seconds=grace)
            if not w.stopped and was_alive and not progress.alive(w, self.settings, now):
                return f"worker {w.name}, which may have taken it, stopped answering"
        return None

    def _revoke(self, batch_id: str) -> None:
        try:
            self.app.control.revoke(batch_id)
        except Exception as e:  # the batch row already says lost: a worker that receives it skips it anyway
            log.warning("could not revoke batch %s: %s", batch_id, e)


def _result(r: dict) -> MeasureResult:
    return MeasureResult(
        tuple(r["costs"]),
        r["error"],
        r["message"],
        r["build_seconds"],
        r["run_seconds"],
        r["timestamp"],
        r.get("cache", WARM),  # a worker of an earlier version timed warm
    )


def _one_line(e: object) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first}"[:500] if isinstance(e, BaseException) else first[:500]
