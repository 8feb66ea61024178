"""What the workers write to the service database: job claims, round progress and endings, measurement batches,
worker rows and artifacts. Each function is one short transaction (server.db.session_scope).

Every write to a job names the attempt it belongs to and changes nothing when the job has moved on to another one,
so a search task that lost its job (reaped, resumed, cancelled) can never overwrite the newer attempt's row."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update

from server.catalog import is_alive
from server.db import session_scope
from server.jobs import owner_lost
from server.models import (
    ArtifactRow,
    Job,
    JobPoint,
    MeasureBatch,
    ModelTask,
    Record,
    UploadedModel,
    WorkerRow,
    Workload,
)
from server.schemas import as_utc as aware  # SQLite gives datetimes back without their zone; all stored are UTC
from server.settings import Settings
from workers.celery_app import measure_queue


def now() -> datetime:
    return datetime.now(UTC)


def alive(row: WorkerRow | None, settings: Settings, at: datetime | None = None) -> bool:
    """A worker row that exists and is alive by the API's rule (not stopped, heartbeat within the grace period)."""
    return row is not None and is_alive(row, settings, at)


def lease_end(settings: Settings) -> datetime:
    """Until when a search that shows progress now holds its job (Job.lease_until)."""
    return now() + timedelta(seconds=settings.job_lease_s)


def finite(x: float) -> float | None:
    """JSON has no infinity: a latency not measured yet is null."""
    return float(x) if math.isfinite(x) else None


# ---------------------------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class Claim:
    """What a search task needs from its job and model, read when it claimed the job."""

    job_id: int
    attempt: int
    model_id: int
    model_path: str
    input_shapes: dict[str, list[int]] | None
    host: str
    queue: str
    trials: int
    trials_done: int
    tuning_s: float
    time_budget_s: float | None
    per_round: int
    seed: int


def claim_job(settings: Settings, job_id: int, attempt: int, worker: str) -> Claim | None:
    """Take a queued job for attempt `attempt` (state running, worker set); None when the message is stale (another
    attempt, or the job is no longer queued). A job cancelled while queued becomes cancelled here."""
    with session_scope(settings) as s:
        job = s.get(Job, job_id, with_for_update=True)
        if job is None or job.attempt != attempt or job.state != "queued":
            return None
        if job.cancel_requested:
            job.state, job.finished_at, job.updated_at = "cancelled", now(), now()
            return None
        model = s.get(UploadedModel, job.model_id)
        if model is None:
            job.state, job.error_message, job.finished_at = "failed", "the job's model no longer exists", now()
            return None
        # error_message keeps a requeue's note (REQUEUED), which counts the searches this job lost
        job.state, job.worker, job.updated_at, job.lease_until = "running", worker, now(), lease_end(settings)
        job.finished_at = None
        job.started_at = job.started_at or now()
        return Claim(
            job.id,
            attempt,
            model.id,
            model.path,
            model.input_shapes or None,
            job.host,
            job.queue,
            job.trials,
            job.trials_done,
            job.tuning_s,
            job.time_budget_s,
            job.per_round,
            job.seed,
        )


def _current(s, job_id: int, attempt: int) -> Job | None:
    """The job row if attempt `attempt` still owns it (running), locked for the update."""
    job = s.get(Job, job_id, with_for_update=True)
    return job if job is not None and job.attempt == attempt and job.state == "running" else None


def interruption(settings: Settings, job_id: int, attempt: int) -> str | None:
    """Why a running search must stop: "cancelled" (asked to), "stale" (another attempt owns the job), or None."""
    with session_scope(settings, write=False) as s:
        job = s.get(Job, job_id)
        if job is None or job.attempt != attempt or job.state != "running":
            return "stale"
        return "cancelled" if job.cancel_requested else None


def check_in(settings: Settings, job_id: int, attempt: int) -> str | None:
    """A running search shows progress: its lease is renewed; returns why it must stop, as interruption()."""
    with session_scope(settings) as s:
        job = _current(s, job_id, attempt)
        if job is None:
            return "stale"
        job.lease_until = lease_end(settings)
        return "cancelled" if job.cancel_requested else None


def record_round(
    settings: Settings,
    job_id: int,
    attempt: int,
    *,
    trials_done: int,
    tuning_s: float,
    estimated_latency: float,
    tasks: list[dict[str, Any]],
    point: dict[str, Any] | None,
) -> str | None:
    """Write a round's progress (and its curve point); returns interruption()'s answer, read in the same transaction."""
    with session_scope(settings) as s:
        job = _current(s, job_id, attempt)
        if job is None:
            return "stale"
        job.trials_done, job.tuning_s, job.tasks, job.updated_at = trials_done, tuning_s, tasks, now()
        job.lease_until = lease_end(settings)
        job.estimated_latency = finite(estimated_latency)
        if point is not None:
            s.add(JobPoint(job_id=job_id, **point))
        return "cancelled" if job.cancel_requested else None


def end_job(settings: Settings, job_id: int, attempt: int, state: str, message: str = "") -> bool:
    """Attempt `attempt` ends the job: succeeded (cancelled if that was asked meanwhile), failed or cancelled."""
    with session_scope(settings) as s:
        job = _current(s, job_id, attempt)
        if job is None:
            return False
        if state == "succeeded" and job.cancel_requested:
            state = "cancelled"
        job.state, job.error_message, job.finished_at, job.updated_at = state, message, now(), now()
        job.lease_until = None
        return True


def requeue_job(settings: Settings, job_id: int, attempt: int) -> int | None:
    """Give a running job back to the queue as attempt + 1 (its worker is going away); returns the new attempt."""
    with session_scope(settings) as s:
        job = _current(s, job_id, attempt)
        if job is None:
            return None
        return _requeue(job)


def _requeue(job: Job) -> int:
    job.attempt += 1
    job.state, job.worker, job.updated_at, job.lease_until = "queued", None, now(), None
    return job.attempt


# the note a job queued again after losing its search carries (in error_message, until it ends or is resumed): how
# many searches in a row it lost, so a job that keeps killing or wedging its search worker ends failed
REQUEUED = re.compile(r"^queued again \((\d+) of \d+\) after its search was lost")


def _search_lost(job: Job, why: str, settings: Settings) -> int | None:
    """A running job whose search was lost (`why`): cancelled if that was asked, else queued again (returns the new
    attempt, to enqueue) up to settings.job_requeues times, else failed saying why."""
    at = now()
    if job.cancel_requested:
        job.state, job.finished_at, job.updated_at, job.lease_until = "cancelled", at, at, None
        job.error_message = f"cancelled while {why}"
        return None
    seen = REQUEUED.match(job.error_message or "")
    lost = (int(seen.group(1)) if seen else 0) + 1
    if lost > settings.job_requeues:
        job.state, job.finished_at, job.updated_at, job.lease_until = "failed", at, at, None
        job.error_message = (
            f"its search was lost {lost} times in a row (last: {why}); resume it once its workers are healthy"
        )
        return None
    job.error_message = f"queued again ({lost} of {settings.job_requeues}) after its search was lost: {why}"
    return _requeue(job)


def reap_lost_jobs(settings: Settings) -> list[tuple[int, int]]:
    """Running jobs whose search was lost (server.jobs.owner_lost: the lease ran out, the worker stopped
    heartbeating) are queued again, failed or cancelled (_search_lost); queued jobs that no search worker took
    within a lease are sent again under the same attempt (their message may have gone with a broker that keeps
    nothing; a duplicate finds the job taken and stops). Returns (job id, attempt) to enqueue."""
    out: list[tuple[int, int]] = []
    with session_scope(settings) as s:
        # FOR UPDATE SKIP LOCKED: two reapers on PostgreSQL never requeue one job twice (SQLite's writers are serial)
        jobs = s.scalars(select(Job).where(Job.state == "running").with_for_update(skip_locked=True)).all()
        names = {j.worker for j in jobs if j.worker}
        workers = {w.name: w for w in s.scalars(select(WorkerRow).where(WorkerRow.name.in_(names)))} if names else {}
        at = now()
        for job in jobs:
            why = owner_lost(job, workers.get(job.worker or ""), settings, at)
            if why is not None:
                attempt = _search_lost(job, why, settings)
                if attempt is not None:
                    out.append((job.id, attempt))
        waited = at - timedelta(seconds=settings.job_lease_s)
        queued = select(Job).where(Job.state == "queued", Job.updated_at < waited).with_for_update(skip_locked=True)
        for job in s.scalars(queued):
            job.updated_at = at
            out.append((job.id, job.attempt))
    return out


def restarted(settings: Settings, worker: str) -> list[tuple[int, int]]:
    """A worker starts under a name whose old process is gone: its running jobs are queued again at once (returned,
    to enqueue; _search_lost) and its unfinished batches marked lost, so their runners send them again without
    waiting."""
    with session_scope(settings) as s:
        jobs = s.scalars(select(Job).where(Job.state == "running", Job.worker == worker).with_for_update()).all()
        out = []
        for job in jobs:
            attempt = _search_lost(job, f"its search worker {worker} restarted", settings)
            if attempt is not None:
                out.append((job.id, attempt))
        s.execute(
            update(MeasureBatch)
            .where(MeasureBatch.worker == worker, MeasureBatch.state.in_(("sent", "running")))
            .values(state="lost", finished_at=now())
        )
    return out


def settle_batches(settings: Settings, job_id: int) -> int:
    """Before an attempt resumes from the records, the batches earlier attempts left: one no worker started is given
    up (a worker that takes it skips it), one measured by a worker that is no longer alive is lost; returns how many
    live workers are still measuring (their records are on the way: the attempt waits for them, so that it resumes
    from every measurement the job made)."""
    with session_scope(settings) as s:
        batches = s.scalars(
            select(MeasureBatch)
            .where(MeasureBatch.job_id == job_id, MeasureBatch.state.in_(("sent", "running")))
            .with_for_update()
        ).all()
        names = {b.worker for b in batches if b.worker}
        workers = {w.name: w for w in s.scalars(select(WorkerRow).where(WorkerRow.name.in_(names)))} if names else {}
        measuring = 0
        for b in batches:
            if b.state == "sent":
                b.state, b.finished_at = "cancelled", now()
            elif alive(workers.get(b.worker or ""), settings):
                measuring += 1
            else:
                b.state, b.finished_at = "lost", now()
        return measuring


def job_measured(settings: Settings, job_id: int) -> int:
    """How many records the job's measurements stored, over all its attempts."""
    with session_scope(settings, write=False) as s:
        return s.scalar(select(func.count()).select_from(Record).where(Record.job_id == job_id)) or 0


def ensure_model_tasks(settings: Settings, model_id: int, tasks: list) -> None:
    """The model's task rows (position, workload, name, weight) as `tasks` gives them; the workloads must be
    described. Rows written by another compiler version (a model registered before its convs' other forms were
    tuned, say) are rewritten, since the job's positions are those of `tasks`."""
    keys = [t.key for t in tasks]
    with session_scope(settings) as s:
        stored = s.execute(
            select(Workload.key)
            .join(ModelTask, ModelTask.workload_id == Workload.id)
            .where(ModelTask.model_id == model_id)
            .order_by(ModelTask.position)
        ).scalars()
        if list(stored) == keys:
            return
        s.execute(delete(ModelTask).where(ModelTask.model_id == model_id))
        found = dict(s.execute(select(Workload.key, Workload.id).where(Workload.key.in_(keys))).all())
        for i, t in enumerate(tasks):
            s.add(ModelTask(model_id=model_id, position=i, workload_id=found[t.key], name=t.name, weight=t.weight))


def live_target(settings: Settings, queue: str) -> dict[str, Any] | None:
    """The stored Target fields of a live worker serving `queue` (the freshest heartbeat first), else None."""
    with session_scope(settings, write=False) as s:
        for w in s.scalars(select(WorkerRow).order_by(WorkerRow.last_heartbeat.desc())):
            if queue in (w.queues or []) and w.target and alive(w, settings):
                return dict(w.target)
    return None


# ---------------------------------------------------------------------------------------------- batches


def batch_sent(
    settings: Settings, batch_id: str, job_id: int | None, task: int | None, size: int, queue: str, try_number: int
) -> None:
    with session_scope(settings) as s:
        s.add(
            MeasureBatch(
                id=batch_id, job_id=job_id, task=task, size=size, queue=queue, try_number=try_number, sent_at=now()
            )
        )


@dataclass(frozen=True)
class BatchView:
    """A batch row and the workers that bear on whether it is lost: its own, and every one serving its queue."""

    state: str
    worker: str | None
    sent_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    workers: dict[str, WorkerRow]


def batch_view(settings: Settings, batch_id: str) -> BatchView | None:
    with session_scope(settings, write=False) as s:
        b = s.get(MeasureBatch, batch_id)
        if b is None:
            return None
        workers = {w.name: w for w in s.scalars(select(WorkerRow)) if w.name == b.worker or b.queue in (w.queues or [])}
        started = aware(b.started_at) if b.started_at else None
        finished = aware(b.finished_at) if b.finished_at else None
        return BatchView(b.state, b.worker, aware(b.sent_at), started, finished, workers)


def batch_ended(settings: Settings, batch_id: str, state: str, errors: dict[str, Any] | None = None) -> None:
    """The runner gives up on a batch (lost, failed) or a worker finishes it (done, not over a lost mark)."""
    with session_scope(settings) as s:
        b = s.get(MeasureBatch, batch_id, with_for_update=True)
        if b is None or (state == "done" and b.state == "lost"):
            return
        b.state, b.finished_at = state, now()
        if errors is not None:
            b.errors = errors


def batch_cancelled(settings: Settings, batch_id: str) -> bool:
    """The job of a batch no worker has started was cancelled: the batch is given up (workers that receive it skip
    it). False if a worker started it (or it ended): its records will be stored."""
    with session_scope(settings) as s:
        b = s.get(MeasureBatch, batch_id, with_for_update=True)
        if b is None or b.state != "sent":
            return False
        b.state, b.finished_at = "cancelled", now()
        return True


def batch_taken(settings: Settings, batch_id: str, worker: str) -> bool:
    """A worker received the batch (it may still wait for the measurement lock); False: it was given up, skip it."""
    with session_scope(settings) as s:
        b = s.get(MeasureBatch, batch_id, with_for_update=True)
        if b is None:
            return True  # sent without a row (by hand): measure it anyway
        if b.state not in ("sent", "running"):
            return False
        b.worker = worker
        return True


def batch_running(settings: Settings, batch_id: str, worker: str) -> bool:
    """The worker holds the measurement lock and starts; False if the batch was given up while it waited."""
    with session_scope(settings) as s:
        b = s.get(MeasureBatch, batch_id, with_for_update=True)
        if b is not None and b.state not in ("sent", "running"):
            return False
        if b is not None:
            b.state, b.worker, b.started_at = "running", worker, now()
        s.execute(update(WorkerRow).where(WorkerRow.name == worker).values(current_batch=batch_id))
        return True


def batch_finished(settings: Settings, batch_id: str, worker: str, measured: int, errors: dict[str, int]) -> None:
    """The worker measured the batch: the row done (unless given up meanwhile) and the worker's count grows."""
    batch_ended(settings, batch_id, "done", errors)
    with session_scope(settings) as s:
        s.execute(
            update(WorkerRow)
            .where(WorkerRow.name == worker)
            .values(measurements_done=WorkerRow.measurements_done + measured, current_batch=None)
        )


def batch_handed_back(settings: Settings, batch_id: str, worker: str) -> None:
    """The worker stops before it measured the whole batch, whose message goes back on the queue: the row as if just
    sent (no worker, not started), so its runner waits for whichever worker takes it."""
    with session_scope(settings) as s:
        b = s.get(MeasureBatch, batch_id, with_for_update=True)
        if b is not None and b.state in ("sent", "running") and b.worker == worker:
            b.state, b.worker, b.started_at = "sent", None, None
        s.execute(update(WorkerRow).where(WorkerRow.name == worker).values(current_batch=None))


def worker_idle(settings: Settings, worker: str) -> None:
    with session_scope(settings) as s:
        s.execute(update(WorkerRow).where(WorkerRow.name == worker).values(current_batch=None))


# ---------------------------------------------------------------------------------------------- workers


def register_worker(
    settings: Settings,
    name: str,
    *,
    kind: str,
    fingerprint: str,
    target: dict[str, Any],
    queues: list[str],
    pid: int,
    hostname: str,
    device: dict[str, Any] | None = None,
) -> None:
    """Insert or refresh the worker's row (by node name): a restarted worker keeps its measurement count. `device`:
    a GPU worker's GPU as its driver reports it (compiler.targets.cuda.fingerprint.GpuFingerprint.fields)."""
    with session_scope(settings) as s:
        row = s.scalars(select(WorkerRow).where(WorkerRow.name == name).with_for_update()).first()
        if row is None:
            row = WorkerRow(name=name, measurements_done=0)
            s.add(row)
        row.kind, row.fingerprint, row.target, row.queues, row.device = kind, fingerprint, target, queues, device
        row.pid, row.hostname, row.started_at, row.last_heartbeat = pid, hostname, now(), now()
        row.current_batch, row.stopped = None, False


def heartbeat(settings: Settings, name: str) -> None:
    with session_scope(settings) as s:
        s.execute(update(WorkerRow).where(WorkerRow.name == name).values(last_heartbeat=now()))


def worker_stopped(settings: Settings, name: str) -> None:
    with session_scope(settings) as s:
        s.execute(update(WorkerRow).where(WorkerRow.name == name).values(stopped=True, current_batch=None))


# ---------------------------------------------------------------------------------------------- artifacts


@dataclass(frozen=True)
class ArtifactJob:
    artifact_id: int
    model_name: str
    model_path: str
    input_shapes: dict[str, list[int]] | None
    host: str
    try_number: int  # 1, and one more for every build lost before this one (REBUILT)


# the note an artifact queued again after losing its build carries (in error_message, until it is ready or fails):
# how many builds in a row it lost, so a model whose build keeps killing its worker ends failed
REBUILT = re.compile(r"^queued again \((\d+) of \d+\) after its build was lost")


def build_lost(artifact: ArtifactRow, worker: WorkerRow | None, settings: Settings, at: datetime) -> str | None:
    """Why a building artifact has no live builder (None: it has one): its worker stopped heartbeating or stopped
    (a worker that leaves a build behind is marked stopped), or no worker holds it (built before workers said)."""
    if artifact.worker is None:
        waited = at - aware(artifact.created_at) > timedelta(seconds=settings.worker_grace_s)
        return "no worker holds it" if waited else None
    if worker is not None and worker.stopped:  # it left the build behind (workers.worker: Ctrl-C)
        return f"its worker {artifact.worker} stopped before it was built"
    if not alive(worker, settings, at):
        return f"its worker {artifact.worker} stopped answering"
    return None


def _build_lost(artifact: ArtifactRow, why: str, settings: Settings) -> bool:
    """A building artifact whose build was lost (`why`) is queued again (True: to send) up to settings.job_requeues
    times in a row, else failed saying why."""
    seen = REBUILT.match(artifact.error_message or "")
    lost = (int(seen.group(1)) if seen else 0) + 1
    artifact.worker = None
    if lost > settings.job_requeues:
        artifact.state, artifact.finished_at = "failed", now()
        artifact.error_message = (
            f"its build was lost {lost} times in a row (last: {why}); compile the model again once its workers are "
            "healthy"
        )
        return False
    artifact.state = "queued"
    artifact.error_message = f"queued again ({lost} of {settings.job_requeues}) after its build was lost: {why}"
    return True


def reap_lost_builds(settings: Settings, restarted: str | None = None) -> list[tuple[int, str]]:
    """Artifacts building on a worker that stopped answering, or (`restarted`) on the worker that starts under that
    name now, are queued again or failed (_build_lost); returns (artifact id, measure queue) to send."""
    out: list[tuple[int, str]] = []
    q = select(ArtifactRow).where(ArtifactRow.state == "building")
    if restarted is not None:
        q = q.where(ArtifactRow.worker == restarted)
    with session_scope(settings, write=False) as s:  # every heartbeat asks: no write lock unless one builds
        if s.scalars(q.limit(1)).first() is None:
            return out
    with session_scope(settings) as s:
        # FOR UPDATE SKIP LOCKED: two reapers on PostgreSQL never queue one artifact twice
        artifacts = s.scalars(q.with_for_update(skip_locked=True)).all()
        if not artifacts:
            return out
        workers = {w.name: w for w in s.scalars(select(WorkerRow))}
        at = now()
        for a in artifacts:
            if restarted is not None:
                why: str | None = f"its worker {restarted} restarted"
            else:
                why = build_lost(a, workers.get(a.worker or ""), settings, at)
            if why is not None and _build_lost(a, why, settings):
                out.append((a.id, _measure_queue(a.host, workers.values())))
    return out


def _measure_queue(host: str, workers) -> str:
    """The measure queue of host class `host`, as a worker serving it names it (measure.<kind>.<host>)."""
    for w in workers:
        for q in w.queues or []:
            if q.startswith("measure.") and q.endswith(f".{host}"):
                return q
    return measure_queue(host)


def artifact_building(settings: Settings, artifact_id: int, worker: str) -> ArtifactJob | None:
    """Take an artifact for `worker` (state building): a queued one, or one whose build was lost (its message came
    back after its worker died, before a reaper saw it: counted as _build_lost does). None if it ended or is gone, or
    a live worker builds it (a duplicate message)."""
    with session_scope(settings) as s:
        a = s.get(ArtifactRow, artifact_id, with_for_update=True)
        if a is None:
            return None
        if a.state == "building" and a.worker != worker:
            builder = s.scalars(select(WorkerRow).where(WorkerRow.name == a.worker)).first() if a.worker else None
            why = build_lost(a, builder, settings, now())
            if why is None or not _build_lost(a, why, settings):
                return None
        if a.state != "queued":
            return None
        model = s.get(UploadedModel, a.model_id)
        if model is None:
            a.state, a.error_message, a.finished_at = "failed", "the model no longer exists", now()
            return None
        seen = REBUILT.match(a.error_message or "")
        a.state, a.worker = "building", worker
        tried = int(seen.group(1)) + 1 if seen else 1
        return ArtifactJob(a.id, model.name, model.path, model.input_shapes or None, a.host, tried)


def _built_by(s, artifact_id: int, worker: str) -> ArtifactRow | None:
    """The artifact row, locked, if `worker` still builds it (not judged lost and taken by another meanwhile)."""
    a = s.get(ArtifactRow, artifact_id, with_for_update=True)
    return a if a is not None and a.state == "building" and a.worker == worker else None


def artifact_builds(settings: Settings, artifact_id: int, worker: str) -> bool:
    """Whether `worker` still builds the artifact (it was not judged lost, and taken by another, meanwhile)."""
    with session_scope(settings, write=False) as s:
        a = s.get(ArtifactRow, artifact_id)
        return a is not None and a.state == "building" and a.worker == worker


def artifact_handed_back(settings: Settings, artifact_id: int, worker: str) -> None:
    """The worker stops before it began the build, whose message goes back on the queue: queued again."""
    with session_scope(settings) as s:
        a = _built_by(s, artifact_id, worker)
        if a is not None:
            a.state, a.worker = "queued", None


def artifact_ready(
    settings: Settings, artifact_id: int, worker: str, *, path: str, sha256: str, size_bytes: int, records_used: list
) -> bool:
    with session_scope(settings) as s:
        a = _built_by(s, artifact_id, worker)
        if a is None:
            return False
        a.state, a.path, a.sha256, a.size_bytes, a.records_used = "ready", path, sha256, size_bytes, records_used
        a.error_message, a.finished_at = "", now()
        return True


def artifact_failed(settings: Settings, artifact_id: int, worker: str, message: str) -> bool:
    with session_scope(settings) as s:
        a = _built_by(s, artifact_id, worker)
        if a is None:
            return False
        a.state, a.error_message, a.finished_at = "failed", message, now()
        return True
