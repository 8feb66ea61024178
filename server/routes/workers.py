"""The measurement farm's workers, shared by every team: who serves which queues, whether it is alive, and what it
is measuring now."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from sqlalchemy import and_, select
from sqlalchemy.orm import aliased

from server.auth import CurrentTeam, SessionDep, SettingsDep
from server.catalog import is_alive
from server.models import Job, MeasureBatch, WorkerRow
from server.schemas import ERROR_RESPONSES, GpuOut, WorkerOut

router = APIRouter(tags=["workers"], responses=ERROR_RESPONSES)


def gpu_out(device: Any) -> GpuOut | None:
    """A GPU worker's `device` (GpuFingerprint.fields) as the API shows it; None for a CPU worker or one unreadable."""
    if not isinstance(device, dict):
        return None
    try:
        major, minor = device["compute_capability"]
        return GpuOut.model_validate({**device, "compute_capability": f"{major}.{minor}"})
    except (KeyError, TypeError, ValueError):
        return None


@router.get("/workers")
def list_workers(who: CurrentTeam, session: SessionDep, settings: SettingsDep) -> list[WorkerOut]:
    """Every worker that registered; alive = not stopped and heard from within TILEFARM_WORKER_GRACE_S, lost = not
    stopped and silent longer. current_job and current_task come from its current batch (a search worker: the job
    it runs), and only for the caller's team's jobs."""
    now = datetime.now(UTC)
    batch_job, search_job = aliased(Job), aliased(Job)
    q = (
        select(WorkerRow, MeasureBatch.job_id, MeasureBatch.task, batch_job.team_id, search_job.id)
        .outerjoin(MeasureBatch, MeasureBatch.id == WorkerRow.current_batch)
        .outerjoin(batch_job, batch_job.id == MeasureBatch.job_id)
        .outerjoin(
            search_job,
            and_(search_job.worker == WorkerRow.name, search_job.state == "running", search_job.team_id == who.team_id),
        )
        .order_by(WorkerRow.name, search_job.id)
    )
    out: dict[str, WorkerOut] = {}
    for w, job_id, task, job_team, searching in session.execute(q):
        if w.name in out:  # a second running search on one worker: the first is shown
            continue
        mine = job_id is not None and job_team == who.team_id
        alive = is_alive(w, settings, now)
        out[w.name] = WorkerOut(
            name=w.name,
            kind=w.kind,
            fingerprint=w.fingerprint,
            gpu=gpu_out(w.device),
            queues=w.queues if isinstance(w.queues, list) else str(w.queues or "").split(","),
            hostname=w.hostname,
            pid=w.pid,
            started_at=w.started_at,
            last_heartbeat=w.last_heartbeat,
            alive=alive,
            state="stopped" if w.stopped else "alive" if alive else "lost",
            measurements_done=w.measurements_done,
            current_batch=w.current_batch,
            current_job=job_id if mine else searching,
            current_task=task if mine else None,
        )
    return list(out.values())
