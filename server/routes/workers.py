"""The measurement farm's workers, shared by every team: who serves which queues, and whether it is alive."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Depends
from sqlalchemy import select

from server.auth import SessionDep, SettingsDep, current_team
from server.catalog import is_alive
from server.models import WorkerRow
from server.schemas import ERROR_RESPONSES, WorkerOut

router = APIRouter(tags=["workers"], responses=ERROR_RESPONSES, dependencies=[Depends(current_team)])


@router.get("/workers")
def list_workers(session: SessionDep, settings: SettingsDep) -> list[WorkerOut]:
    """Every worker that registered; alive = not stopped and heard from within TILEFARM_WORKER_GRACE_S."""
    now = datetime.now(UTC)
    return [
        WorkerOut(
            name=w.name,
            kind=w.kind,
            fingerprint=w.fingerprint,
            queues=w.queues if isinstance(w.queues, list) else str(w.queues or "").split(","),
            hostname=w.hostname,
            pid=w.pid,
            started_at=w.started_at,
            last_heartbeat=w.last_heartbeat,
            alive=is_alive(w, settings, now),
            measurements_done=w.measurements_done,
            current_batch=w.current_batch,
        )
        for w in session.scalars(select(WorkerRow).order_by(WorkerRow.name))
    ]
