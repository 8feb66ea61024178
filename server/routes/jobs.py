"""Tuning jobs: create, list, show, cancel, resume, and their progress (polled, or streamed as server-sent events)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Query, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from server import accounts, job_detail, jobs
from server.auth import CurrentTeam, EventStreamTeam, SessionDep, SettingsDep
from server.models import ApiToken
from server.params import INT64_MAX, Id, LastEventId, Offset
from server.schemas import (
    ERROR_RESPONSES,
    EventTicket,
    JobBatches,
    JobCreate,
    JobErrors,
    JobOut,
    JobRecordPage,
    JobState,
    NotFound,
    Progress,
    RecordFilter,
    RecordOrder,
    error_responses,
)
from server.settings import Settings

router = APIRouter(tags=["jobs"], responses=ERROR_RESPONSES)

POLL_S = 0.5  # how often the event stream looks at the job
KEEPALIVE_S = 15.0  # a comment line this often when nothing changed, so proxies keep the connection open


@router.post("/jobs", status_code=status.HTTP_201_CREATED, responses=error_responses(404, 429, 503))
def create_job(body: JobCreate, who: CurrentTeam, settings: SettingsDep) -> JobOut:
    return jobs.create_job(settings, who.team_id, body)


@router.get("/jobs")
def list_jobs(
    who: CurrentTeam,
    session: SessionDep,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[JobOut]:
    """The team's jobs, newest first."""
    return jobs.list_jobs(session, who.team_id, state, limit)


@router.get("/jobs/{job_id}", responses=error_responses(404))
def get_job(job_id: Id, who: CurrentTeam, session: SessionDep) -> JobOut:
    return jobs.job_view(session, jobs.get_job(session, who.team_id, job_id))


@router.post("/jobs/{job_id}/cancel", responses=error_responses(404, 409))
def cancel_job(job_id: Id, who: CurrentTeam, settings: SettingsDep) -> JobOut:
    """A queued job is cancelled at once; a running one stops at the end of its current round."""
    return jobs.cancel_job(settings, who.team_id, job_id)


@router.post("/jobs/{job_id}/resume", responses=error_responses(404, 409, 429, 503))
def resume_job(job_id: Id, who: CurrentTeam, settings: SettingsDep) -> JobOut:
    """Queue a failed or cancelled job again; it goes on from the records it has measured."""
    return jobs.resume_job(settings, who.team_id, job_id)


@router.get("/jobs/{job_id}/progress", responses=error_responses(404))
def job_progress(job_id: Id, who: CurrentTeam, settings: SettingsDep, after: Offset = 0) -> Progress:
    """The job and its convergence points with an id above `after`."""
    return jobs.progress(settings, who.team_id, job_id, after)


@router.get("/jobs/{job_id}/records", responses=error_responses(404))
def job_records(
    job_id: Id,
    who: CurrentTeam,
    session: SessionDep,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    task: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="task position in the job's model")] = None,
    error: Annotated[RecordFilter | None, Query(description="an error group, ok (no error) or failed (any)")] = None,
    order: Annotated[RecordOrder, Query(description="id, -id (newest first) or latency (fastest first)")] = "id",
) -> JobRecordPage:
    """A page of the records the job's measurements made, with the total that match the filters."""
    return job_detail.job_records(
        session, who.team_id, job_id, offset=offset, limit=limit, task=task, error=error, order=order
    )


@router.get("/jobs/{job_id}/errors", responses=error_responses(404))
def job_errors(
    job_id: Id, who: CurrentTeam, session: SessionDep, latest: Annotated[int, Query(ge=0, le=500)] = 20
) -> JobErrors:
    """The job's failed measurements per error group (build, run, timeout, wrong_answer), and the latest ones."""
    return job_detail.job_errors(session, who.team_id, job_id, latest)


@router.get("/jobs/{job_id}/batches", responses=error_responses(404))
def job_batches(
    job_id: Id, who: CurrentTeam, session: SessionDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 2000
) -> JobBatches:
    """The timeline of the job's measurement batches (the latest `limit`, by sent_at): worker, state, times."""
    return job_detail.job_batches(session, who.team_id, job_id, limit)


@router.post("/jobs/{job_id}/events/ticket", responses=error_responses(404))
def job_events_ticket(job_id: Id, who: CurrentTeam, session: SessionDep) -> EventTicket:
    """A ticket that opens this job's event stream (`GET /jobs/{job_id}/events?ticket=...`) for the next minute,
    for clients that cannot send the token in a header (a browser's EventSource); a token in a URL would end up in
    access logs. Revoking the token ends its tickets."""
    jobs.get_job(session, who.team_id, job_id)  # another team's job is as unknown as a missing one
    ticket, expires_at = accounts.issue_ticket(session.get_one(ApiToken, who.token_id), job_id)
    return EventTicket(ticket=ticket, expires_at=expires_at)


def _event(name: str, data: str, event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {data}\n\n"


async def _events(settings: Settings, team_id: int, job_id: int, current: Progress, after: int) -> AsyncIterator[str]:
    """`progress` whenever the job or its points change, `end` once it is terminal. Each progress event's id is its
    last point's, so a client that reconnects (Last-Event-ID) gets only the points it has not seen."""
    sent_job, quiet = "", 0.0
    while True:
        job_json = current.job.model_dump_json()
        if current.points or job_json != sent_job:
            after = current.points[-1].id if current.points else after
            yield _event("progress", current.model_dump_json(), after or None)
            sent_job, quiet = job_json, 0.0
        if current.job.state in jobs.TERMINAL:
            yield _event("end", json.dumps({"id": job_id, "state": current.job.state}))
            return
        await asyncio.sleep(POLL_S)
        quiet += POLL_S
        if quiet >= KEEPALIVE_S:
            yield ": keepalive\n\n"
            quiet = 0.0
        try:
            current = await run_in_threadpool(jobs.progress, settings, team_id, job_id, after)
        except NotFound:  # deleted meanwhile (with its model or team)
            yield _event("end", json.dumps({"id": job_id, "state": "deleted"}))
            return


@router.get(
    "/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        **error_responses(404),
        200: {"content": {"text/event-stream": {}}, "description": "server-sent events"},
    },
)
async def job_events(
    job_id: Id,
    who: EventStreamTeam,
    settings: SettingsDep,
    after: Offset = 0,
    last_event_id: LastEventId = None,
) -> StreamingResponse:
    """Server-sent events: `progress` (the /progress JSON with the new points) on every change, then `end`. Send
    the token as a bearer header, or (EventSource cannot) `?ticket=` from POST /jobs/{job_id}/events/ticket."""
    since = max(after, last_event_id or 0)
    first = await run_in_threadpool(jobs.progress, settings, who.team_id, job_id, since)  # a 404 before streaming
    return StreamingResponse(
        _events(settings, who.team_id, job_id, first, since),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
