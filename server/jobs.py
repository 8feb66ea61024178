"""Work a team sends to the farm: tuning jobs (created queued and sent to the search queue, cancelled, resumed) and
compiles (artifacts built on a worker of the host class), with the JSON views the API shows of them.

A job's row is committed before its message is sent, so the search task always finds it; every enqueue carries the
job's `attempt`, and a search task whose attempt is no longer the job's stops (server/models.py's Job)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from compiler.costs.records import target_name
from compiler.search.budget import first_round_sizes, shortfall
from server import catalog
from server.db import session_scope
from server.models import ArtifactRow, Job, JobPoint, ModelTask, UploadedModel, WorkerRow, Workload
from server.schemas import (
    ArtifactOut,
    CompileRequest,
    Conflict,
    Invalid,
    JobCreate,
    JobOut,
    JobTaskRow,
    NotFound,
    PointOut,
    Progress,
    TooMany,
    Unavailable,
    as_utc,
    target_kind,
)
from server.settings import Settings
from workers.celery_app import measure_queue
from workers.dispatch import enqueue_compile, enqueue_job

TERMINAL = ("succeeded", "failed", "cancelled")
STATES = ("queued", "running", *TERMINAL)
RESUMABLE = ("failed", "cancelled")


def _now() -> datetime:
    return datetime.now(UTC)


def _one_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _broker_down(e: Exception, what: str) -> Unavailable:
    return Unavailable(f"the broker did not take the {what}: {_one_line(e)}", code="broker_unavailable")


def owner_lost(job: Job, worker: WorkerRow | None, settings: Settings, at: datetime) -> str | None:
    """Why a running job has no live search (None: it has one): its lease ran out (the search renews it while it
    makes progress: its worker died, or the search is stuck or gave the job up), or its search worker stopped
    heartbeating (dead before the lease says so), or no worker took it. The same rule for the reaper of the search
    workers (workers.progress.reap_lost_jobs) and for cancel and resume here."""
    if job.lease_until is not None and as_utc(job.lease_until) < at:
        return f"its lease ran out at {as_utc(job.lease_until):%Y-%m-%d %H:%M:%S} UTC (search on {job.worker})"
    if job.worker is not None and (worker is None or not catalog.is_alive(worker, settings, at)):
        return f"its search worker {job.worker} stopped answering"
    if job.worker is None and at - as_utc(job.updated_at or at) > timedelta(seconds=settings.worker_grace_s):
        return "no search worker holds it"
    return None


def _owner_lost(session: Session, job: Job, settings: Settings) -> str | None:
    if job.state != "running":
        return None
    worker = session.scalars(select(WorkerRow).where(WorkerRow.name == job.worker)).first() if job.worker else None
    return owner_lost(job, worker, settings, _now())


# ---------------------------------------------------------------------------------------------- jobs


def get_job(session: Session, team_id: int, job_id: int, lock: bool = False) -> Job:
    """A job of the team; another team's id is as unknown as a missing one. `lock`: SELECT ... FOR UPDATE, so a
    state change cannot interleave with the search task's own (PostgreSQL; SQLite has one writer anyway)."""
    job = session.get(Job, job_id, with_for_update=lock)
    if job is None or job.team_id != team_id:
        raise NotFound(f"no job {job_id}")
    return job


def create_job(settings: Settings, team_id: int, request: JobCreate) -> JobOut:
    """A queued job (attempt 1) on the requested host class, sent to the search queue; within the team's share of the
    farm (max_job_trials, max_active_jobs)."""
    if request.trials > settings.max_job_trials:
        raise Invalid(
            f"trials: at most {settings.max_job_trials} per job on this server (TILEFARM_MAX_JOB_TRIALS), "
            f"got {request.trials}; a job can be resumed for more once it ends"
        )
    with session_scope(settings, write=False) as session:
        _check_active_jobs(session, settings, team_id)
        model = catalog.get_model(session, team_id, request.model_id)
        target = catalog.resolve_target(session, settings, request.target, request.host)
    host = target.fingerprint()
    with session_scope(settings) as session:
        job = Job(
            team_id=team_id,
            model_id=model.id,
            state="queued",
            target=target_name(target),
            host=host,
            queue=measure_queue(host, target.kind),
            trials=request.trials,
            time_budget_s=request.time_budget_s,
            per_round=request.per_round,
            seed=request.seed,
            attempt=1,
            updated_at=_now(),
        )
        session.add(job)
        session.flush()
        job_id = job.id
    _enqueue(settings, job_id, 1)
    return job_out(settings, team_id, job_id)


def _enqueue(settings: Settings, job_id: int, attempt: int) -> None:
    try:
        enqueue_job(settings, job_id, attempt)
    except Exception as e:
        error = _broker_down(e, "job")
        with session_scope(settings) as session:
            job = session.get(Job, job_id)
            if job is not None and job.attempt == attempt and job.state == "queued":
                job.state, job.finished_at, job.updated_at = "failed", _now(), _now()
                job.error_message = f"{error.detail}; resume the job once the broker is reachable"
        raise error from None


def cancel_job(settings: Settings, team_id: int, job_id: int) -> JobOut:
    """Request a stop: a queued job is cancelled at once, a running one by its search at the end of its round, or at
    once when it has no live search (owner_lost)."""
    with session_scope(settings) as session:
        job = get_job(session, team_id, job_id, lock=True)
        if job.state in TERMINAL:
            raise Conflict(f"job {job_id} is {job.state} already", code="job_finished")
        job.cancel_requested = True
        job.updated_at = _now()
        lost = _owner_lost(session, job, settings)
        if job.state == "queued" or lost:
            job.state, job.finished_at, job.lease_until = "cancelled", _now(), None
            job.error_message = f"cancelled while {lost}" if lost else ""
    return job_out(settings, team_id, job_id)


def resume_job(settings: Settings, team_id: int, job_id: int) -> JobOut:
    """Queue a failed or cancelled job again as its next attempt, or a running one that has no live search
    (owner_lost); its search resumes from the records database."""
    with session_scope(settings) as session:
        job = get_job(session, team_id, job_id, lock=True)
        if job.state in RESUMABLE:
            _check_active_jobs(session, settings, team_id)
        if job.state not in RESUMABLE and not _owner_lost(session, job, settings):
            lease = f" (its lease runs to {as_utc(job.lease_until):%H:%M:%S} UTC)" if job.lease_until else ""
            raise Conflict(
                f"job {job_id} is {job.state}{lease}: only a failed or cancelled job, or a running one whose search "
                "was lost, can be resumed",
                code="job_not_resumable",
            )
        job.lease_until = None
        job.state, job.cancel_requested, job.error_message = "queued", False, ""
        job.attempt += 1
        job.worker, job.finished_at, job.updated_at = None, None, _now()
        attempt = job.attempt
    _enqueue(settings, job_id, attempt)
    return job_out(settings, team_id, job_id)


def _check_active_jobs(session: Session, settings: Settings, team_id: int) -> None:
    """429 when the team already has max_active_jobs queued or running (checked before the write, so two requests at
    the same moment may both pass: a share of the farm, not a hard quota)."""
    active = session.scalar(
        select(func.count()).select_from(Job).where(Job.team_id == team_id, Job.state.in_(("queued", "running")))
    )
    if active and active >= settings.max_active_jobs:
        raise TooMany(
            f"the team has {active} jobs queued or running, the most this server runs at once for one team "
            "(TILEFARM_MAX_ACTIVE_JOBS): cancel one or wait for one to end",
            code="too_many_jobs",
        )


def budget_note(job: Job, rows: list[JobTaskRow]) -> str | None:
    """What the job's trial budget leaves out, or why a finished job has no estimate (None: nothing to say). The
    first rounds are the scheduler's own (compiler.search.budget); a task with trials is measured already."""
    weights = [r.weight or 0 for r in rows]
    works = [(r.weight or 0) * (r.flops or 0) for r in rows]
    firsts = [0 if r.trials else n for r, n in zip(rows, first_round_sizes(job.per_round, works))]
    if job.state in TERMINAL:
        if job.estimated_latency is not None or job.state == "failed" and job.error_message:
            return None
        never = [r for r in rows if r.weight and not r.trials]
        failed = [r for r in rows if r.weight and r.trials and r.latency_s is None]
        why = []
        if never:
            why.append(f"{len(never)} of the model's {sum(1 for w in weights if w)} tasks were never measured "
                       f"(the budget ended before their first round)")  # fmt: skip
        if failed:
            why.append(f"no program of {len(failed)} tasks ran (the job's errors say why)")
        if not why:
            return None
        more = f"; resume it with {sum(firsts)} trials or more to give each its first round" if never else ""
        return f"no end-to-end estimate: {'; '.join(why)}. Those tasks compile with their default schedules{more}"
    short = shortfall(firsts, weights, job.trials - job.trials_done)
    if short is None:
        return None
    own = short.tasks - short.forms
    forms = f" ({own} of the model's, {short.forms} other forms of its convs)" if short.forms else ""
    left = short.tasks - short.reached
    return (
        f"{short.budget} trials do not give every task its first round: one round for each of the {short.tasks} tasks "
        f"to measure{forms} takes {short.need}. About {short.reached} will be measured and {left} not: a task never "
        "measured keeps its default schedule when compiled, and the job will have no end-to-end "
        f"estimate. {short.need} trials or more give every task a round, the rest going where the most time is won."
    )


def _model_task_table(session: Session, model_id: int) -> list[dict]:
    """The task table of a job no round has finished yet: the model's tasks, nothing measured."""
    q = (
        select(ModelTask.position, ModelTask.name, ModelTask.weight, Workload.flops)
        .join(Workload, Workload.id == ModelTask.workload_id)
        .where(ModelTask.model_id == model_id)
        .order_by(ModelTask.position)
    )
    return [{"position": p, "name": n, "weight": w, "flops": f} for p, n, w, f in session.execute(q)]


def job_view(session: Session, job: Job, model_name: str | None = None) -> JobOut:
    if model_name is None:
        model_name = session.get_one(UploadedModel, job.model_id).name
    rows = job.tasks if isinstance(job.tasks, list) else _model_task_table(session, job.model_id)
    table = [JobTaskRow.model_validate({"position": i, **r}) for i, r in enumerate(rows) if isinstance(r, dict)]
    return JobOut(
        id=job.id,
        model_id=job.model_id,
        model_name=model_name,
        state=job.state,
        target=job.target,
        target_kind=target_kind(job.target),
        host=job.host,
        trials=job.trials,
        trials_done=job.trials_done,
        time_budget_s=job.time_budget_s,
        per_round=job.per_round,
        seed=job.seed,
        estimated_latency_s=job.estimated_latency,
        tuning_s=job.tuning_s,
        error_message=job.error_message,
        worker=job.worker,
        attempt=job.attempt,
        cancel_requested=job.cancel_requested,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        tasks=table,
        note=budget_note(job, table),
    )


def job_out(settings: Settings, team_id: int, job_id: int) -> JobOut:
    with session_scope(settings, write=False) as session:
        return job_view(session, get_job(session, team_id, job_id))


def list_jobs(session: Session, team_id: int, state: str | None = None, limit: int = 100) -> list[JobOut]:
    """The team's jobs, newest first."""
    q = select(Job, UploadedModel.name).join(UploadedModel, UploadedModel.id == Job.model_id)
    q = q.where(Job.team_id == team_id)
    if state is not None:
        q = q.where(Job.state == state)
    rows = session.execute(q.order_by(Job.id.desc()).limit(limit))
    return [job_view(session, job, name) for job, name in rows]


def point_view(p: JobPoint) -> PointOut:
    return PointOut(
        id=p.id,
        trials=p.trials,
        elapsed_s=p.elapsed_s,
        estimated_latency_s=p.estimated_latency,
        task=p.task,
        task_best=p.task_best,
        errors=p.errors,
        created_at=p.created_at,
    )


def progress(settings: Settings, team_id: int, job_id: int, after: int = 0) -> Progress:
    """The job object and its convergence points with an id above `after` (what a poller has not seen yet)."""
    with session_scope(settings, write=False) as session:
        job = get_job(session, team_id, job_id)
        points = session.scalars(
            select(JobPoint).where(JobPoint.job_id == job.id, JobPoint.id > after).order_by(JobPoint.id)
        )
        return Progress(job=job_view(session, job), points=[point_view(p) for p in points])


# ---------------------------------------------------------------------------------------------- compiles


def get_artifact(session: Session, team_id: int, artifact_id: int) -> ArtifactRow:
    artifact = session.get(ArtifactRow, artifact_id)
    if artifact is None or artifact.team_id != team_id:
        raise NotFound(f"no artifact {artifact_id}")
    return artifact


def artifact_view(session: Session, artifact: ArtifactRow, model_name: str | None = None) -> ArtifactOut:
    if model_name is None:
        model_name = session.get_one(UploadedModel, artifact.model_id).name
    return ArtifactOut(
        id=artifact.id,
        model_id=artifact.model_id,
        model_name=model_name,
        state=artifact.state,
        target=artifact.target,
        host=artifact.host,
        sha256=artifact.sha256,
        size_bytes=artifact.size_bytes,
        records_used=artifact.records_used,
        error_message=artifact.error_message,
        created_at=artifact.created_at,
        finished_at=artifact.finished_at,
    )


def list_artifacts(session: Session, team_id: int) -> list[ArtifactOut]:
    q = select(ArtifactRow, UploadedModel.name).join(UploadedModel, UploadedModel.id == ArtifactRow.model_id)
    rows = session.execute(q.where(ArtifactRow.team_id == team_id).order_by(ArtifactRow.id.desc()))
    return [artifact_view(session, a, name) for a, name in rows]


def request_compile(settings: Settings, team_id: int, model_id: int, request: CompileRequest) -> ArtifactOut:
    """A queued artifact of the model, built by a worker of the host class with the records' best schedules."""
    with session_scope(settings, write=False) as session:
        model = catalog.get_model(session, team_id, model_id)
        target = catalog.resolve_target(session, settings, request.target, request.host)
    host = target.fingerprint()
    with session_scope(settings) as session:
        artifact = ArtifactRow(
            team_id=team_id, model_id=model.id, state="queued", target=target_name(target), host=host
        )
        session.add(artifact)
        session.flush()
        artifact_id = artifact.id
    try:
        enqueue_compile(settings, artifact_id, measure_queue(host, target.kind))
    except Exception as e:
        error = _broker_down(e, "compile")
        with session_scope(settings) as session:
            row = session.get_one(ArtifactRow, artifact_id)
            row.state, row.error_message, row.finished_at = "failed", error.detail, _now()
        raise error from None
    with session_scope(settings, write=False) as session:
        return artifact_view(session, get_artifact(session, team_id, artifact_id))
