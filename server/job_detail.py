"""What the dashboard shows of one job beyond its progress: the records its measurements made (paged in SQL), their
error breakdown, and the timeline of its measurement batches. A 20,000-record job is never read whole: every answer
is a LIMIT/OFFSET page or a GROUP BY on the (job_id, id) index."""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Session

from server.jobs import get_job
from server.models import Job, MeasureBatch, ModelTask, Record
from server.schemas import (
    BatchOut,
    ErrorCounts,
    ErrorGroup,
    Invalid,
    JobBatches,
    JobErrorOut,
    JobErrors,
    JobRecordOut,
    JobRecordPage,
    RecordFilter,
    RecordOrder,
)

# The one place stored error codes (compiler.costs.measure's, and "timeout"/"crash" from older or imported records) are
# grouped for the breakdown. Any other code (compiler.costs.measure.UNKNOWN: a lost batch, a reference that failed, a
# worker of the wrong host class) counts as "run": something went wrong running the measurement.
ERROR_GROUPS: dict[ErrorGroup, tuple[str, ...]] = {
    "build": ("build", "instantiation"),  # lowering, codegen or linking failed, or the steps do not replay
    "timeout": ("build_timeout", "run_timeout", "timeout"),
    "wrong_answer": ("wrong_answer",),
    "run": ("run", "crash"),  # and every code not named above
}
CATCH_ALL: ErrorGroup = "run"
_GROUP_OF = {code: group for group, codes in ERROR_GROUPS.items() for code in codes}


def error_group(code: str | None) -> ErrorGroup | None:
    """The breakdown group of a stored error code (None for an error-free record)."""
    return None if code is None else _GROUP_OF.get(code, CATCH_ALL)


def _error_filter(wanted: RecordFilter) -> ColumnElement[bool]:
    """The SQL condition for a records filter, agreeing with error_group (the catch-all included)."""
    if wanted == "ok":
        return Record.error.is_(None)
    if wanted == "failed":
        return Record.error.is_not(None)
    if wanted == CATCH_ALL:
        named = [c for group, codes in ERROR_GROUPS.items() if group != CATCH_ALL for c in codes]
        return and_(Record.error.is_not(None), Record.error.not_in(named))
    return Record.error.in_(ERROR_GROUPS[wanted])


def _tasks(session: Session, job: Job) -> dict[int, tuple[int, str]]:
    """workload id -> (position, name) of the job's model tasks."""
    q = select(ModelTask.workload_id, ModelTask.position, ModelTask.name).where(ModelTask.model_id == job.model_id)
    return {w: (p, n) for w, p, n in session.execute(q)}


def job_records(
    session: Session,
    team_id: int,
    job_id: int,
    *,
    offset: int = 0,
    limit: int = 50,
    task: int | None = None,
    error: RecordFilter | None = None,
    order: RecordOrder = "id",
) -> JobRecordPage:
    """A page of the records the job's measurements made, filtered by task position and error group."""
    job = get_job(session, team_id, job_id)
    tasks = _tasks(session, job)
    where: list[ColumnElement[bool]] = [Record.job_id == job.id]
    if task is not None:
        workload = next((w for w, (p, _) in tasks.items() if p == task), None)
        if workload is None:
            raise Invalid(f"job {job_id}'s model has no task {task} (it has {len(tasks)})", code="unknown_task")
        where.append(Record.workload_id == workload)
    if error is not None:
        where.append(_error_filter(error))
    total = session.scalar(select(func.count()).select_from(Record).where(*where)) or 0
    ordering = {
        "id": (Record.id,),
        "-id": (Record.id.desc(),),
        "latency": (Record.mean_cost.is_(None), Record.mean_cost, Record.id),  # failed ones last
    }[order]
    q = select(
        Record.id,
        Record.workload_id,
        Record.mean_cost,
        Record.cache,
        Record.error,
        Record.error_message,
        Record.timestamp,
        Record.created_by,
        Record.build_seconds,
        Record.run_seconds,
    ).where(*where)
    rows = session.execute(q.order_by(*ordering).limit(limit).offset(offset))
    return JobRecordPage(
        total=total,
        records=[
            JobRecordOut(
                id=r.id,
                task=tasks[r.workload_id][0] if r.workload_id in tasks else None,
                task_name=tasks[r.workload_id][1] if r.workload_id in tasks else None,
                mean_cost=r.mean_cost,
                cache=r.cache,
                error=r.error,
                group=error_group(r.error),
                error_message=r.error_message,
                timestamp=r.timestamp,
                created_by=r.created_by,
                build_seconds=r.build_seconds,
                run_seconds=r.run_seconds,
            )
            for r in rows
        ],
    )


def job_errors(session: Session, team_id: int, job_id: int, latest: int = 20) -> JobErrors:
    """How many of the job's records failed, per error group (one GROUP BY), and the `latest` failures."""
    job = get_job(session, team_id, job_id)
    counts, ok = ErrorCounts(), 0
    for code, n in session.execute(
        select(Record.error, func.count()).where(Record.job_id == job.id).group_by(Record.error)
    ):
        group = error_group(code)
        if group is None:
            ok += n
        else:
            setattr(counts, group, getattr(counts, group) + n)
    tasks = _tasks(session, job) if latest else {}
    rows = session.execute(
        select(Record.id, Record.workload_id, Record.error, Record.error_message, Record.timestamp)
        .where(Record.job_id == job.id, Record.error.is_not(None))
        .order_by(Record.id.desc())
        .limit(latest)
    )
    return JobErrors(
        counts=counts,
        ok=ok,
        latest=[
            JobErrorOut(
                record_id=r.id,
                task=tasks[r.workload_id][0] if r.workload_id in tasks else None,
                error=r.error,
                group=error_group(r.error) or CATCH_ALL,
                error_message=r.error_message,
                timestamp=r.timestamp,
            )
            for r in rows
        ],
    )


def job_batches(session: Session, team_id: int, job_id: int, limit: int = 2000) -> JobBatches:
    """The job's latest `limit` measurement batches, oldest first: who measured what, when, and how it ended."""
    job = get_job(session, team_id, job_id)
    total = session.scalar(select(func.count()).select_from(MeasureBatch).where(MeasureBatch.job_id == job.id)) or 0
    latest = session.scalars(
        select(MeasureBatch)
        .where(MeasureBatch.job_id == job.id)
        .order_by(MeasureBatch.sent_at.desc(), MeasureBatch.id.desc())
        .limit(limit)
    ).all()
    return JobBatches(
        total=total,
        batches=[
            BatchOut(
                id=b.id,
                task=b.task,
                size=b.size,
                queue=b.queue,
                worker=b.worker,
                state=b.state,
                try_number=b.try_number,
                errors=b.errors if isinstance(b.errors, dict) else None,
                sent_at=b.sent_at,
                started_at=b.started_at,
                finished_at=b.finished_at,
            )
            for b in reversed(latest)
        ],
    )
