"""Tuning records, shared by every team: browse, export as JSON lines, import JSON lines."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse
from sqlalchemy import func, select
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from compiler.costs.records import RecordError, TuningRecord
from server import storage, trust, workloads
from server.auth import CurrentTeam, SessionDep, SettingsDep, current_team, require_admin
from server.catalog import records_db
from server.db import session_scope
from server.models import Host, Record, TargetRow, Workload
from server.params import BigId, Offset
from server.schemas import (
    ERROR_RESPONSES,
    ImportResult,
    Invalid,
    RecordOut,
    RecordPage,
    ScheduleOut,
    Text,
    WorkloadOrder,
    WorkloadPage,
    error_responses,
)
from server.settings import Settings

router = APIRouter(tags=["records"], responses=ERROR_RESPONSES, dependencies=[Depends(current_team)])

# the widths of the columns an imported record's fields go to (PostgreSQL refuses longer values mid-import)
FIELD_CHARS = {"workload_key": 64, "host": 64, "target": 255, "error": 32, "version": 32}
IMPORT_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/x-ndjson": {"schema": {"type": "string", "description": "JSON lines (records export)"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {"file": {"type": "string", "format": "binary"}},
                }
            },
        },
    }
}


@router.get("/records")
def list_records(
    session: SessionDep,
    workload: Annotated[Text | None, Query(max_length=64, description="workload key")] = None,
    host: Annotated[Text | None, Query(max_length=64, description="host fingerprint")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> RecordPage:
    """Records in commit order, filtered by workload and host."""
    where = []
    if workload:
        where.append(Workload.key == workload)
    if host:
        where.append(Host.fingerprint == host)
    joined = (
        select(Record.id)
        .join(Workload, Record.workload_id == Workload.id)
        .join(TargetRow, Record.target_id == TargetRow.id)
        .join(Host, Record.host_id == Host.id)
        .where(*where)
    )
    total = session.scalar(select(func.count()).select_from(joined.subquery())) or 0
    q = joined.add_columns(
        Workload.key,
        TargetRow.name,
        Host.fingerprint,
        Record.mean_cost,
        Record.cache,
        Record.costs,
        Record.error,
        Record.error_message,
        Record.timestamp,
        Record.created_by,
        Record.verified,
        Record.imported_by,
    )
    rows = session.execute(q.order_by(Record.id).limit(limit).offset(offset))
    return RecordPage(
        total=total,
        records=[
            RecordOut(
                id=i,
                workload_key=key,
                target=target,
                host=fp,
                mean_cost=mean,
                cache=cache,
                costs=costs,
                error=error,
                error_message=message,
                timestamp=timestamp,
                created_by=by,
                verified=verified,
                imported_by=imported_by,
            )
            for i, key, target, fp, mean, cache, costs, error, message, timestamp, by, verified, imported_by in rows
        ],
    )


@router.get("/records/workloads")
def browse_workloads(
    session: SessionDep,
    who: CurrentTeam,
    offset: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    q: Annotated[Text | None, Query(max_length=200, description="a substring of the op tag or workload key")] = None,
    order: Annotated[WorkloadOrder, Query(description="records, -records (most first), flops or -flops")] = "-records",
) -> WorkloadPage:
    """Workloads with their record counts and, per host class, the number of records (and of unverified ones) and
    the fastest one the team may use."""
    return workloads.browse_workloads(session, offset=offset, limit=limit, q=q, order=order, team_id=who.team_id)


@router.get("/records/{record_id}/schedule", responses=error_responses(404))
def record_schedule(record_id: BigId, session: SessionDep) -> ScheduleOut:
    """The record's schedule: its steps replayed on the workload's DAG, lowered and printed as a loop nest (422 when
    the steps do not replay)."""
    return workloads.record_schedule(session, record_id)


@router.get(
    "/records/export",
    response_class=FileResponse,
    responses={200: {"content": {"application/x-ndjson": {}}, "description": "JSON lines"}},
)
def export_records(settings: SettingsDep, who: CurrentTeam, best_only: bool = False) -> FileResponse:
    """Every record the team may use (verified, or imported by it: server.trust), or the fastest of them per
    workload, target and host, as the JSON lines `records import` reads."""
    path = storage.scratch_path(settings, ".jsonl")
    try:
        records_db(settings.database_url).trusting(who.team_id).export(path, best_only)
    except BaseException:
        storage.delete(path)
        raise
    return FileResponse(
        path,
        media_type="application/x-ndjson",
        filename="records.jsonl",
        background=BackgroundTask(storage.delete, path),
    )


def check_records_file(path: Path, check: trust.ImportCheck | None = None) -> None:
    """Read every line before importing any: a malformed one (or, with `check`, one that fails server.trust's
    checks: steps that do not replay, a timing faster than the hardware, a malformed host or target) is refused with
    its line number, and nothing added (the import commits in batches, so a bad line found midway would leave the
    batches before it)."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode()
            except UnicodeDecodeError:
                raise Invalid(f"line {n}: not UTF-8 text", code="invalid_records") from None
            if not line.strip():
                continue
            try:
                record = TuningRecord.from_json(line)
            except RecordError as e:
                raise Invalid(f"line {n}: {e}", code="invalid_records") from None
            problem = None
            if not isinstance(record.steps, tuple):
                problem = "steps is not a list"
            elif not all(math.isfinite(c) and c >= 0 for c in record.costs):
                problem = "costs must be finite, non-negative seconds"
            for name, chars in FIELD_CHARS.items():
                value = getattr(record, name)
                if not isinstance(value, str | None) or len(value or "") > chars:
                    problem = f"{name} is not a string of at most {chars} characters"
            if problem is None and check is not None:
                problem = check.problem(record)
            if problem:
                raise Invalid(f"line {n}: {problem}", code="invalid_records")


def _import(settings: Settings, path: Path, team_id: int) -> ImportResult:
    with session_scope(settings, write=False) as session:
        check = trust.ImportCheck(session, settings)
        check_records_file(path, check)
    added = records_db(settings.database_url).import_file(path, imported_by=team_id)
    trust.request_verification(settings)  # the farm measures them (workers.tasks.verify_records)
    return ImportResult(added=added, unknown_workloads=sorted(check.unknown))


@router.post(
    "/records/import",
    openapi_extra=IMPORT_BODY,
    responses=error_responses(403, 413),
    dependencies=[Depends(require_admin)],  # records are shared by every team: an admin token adds to them
)
async def import_records(request: Request, settings: SettingsDep, who: CurrentTeam) -> ImportResult:
    """Add the records of a JSON-lines file (the request body, or a multipart `file` part); returns how many were
    new, and the workloads no uploaded model describes. Records already stored are skipped, so importing a file twice
    adds nothing. Every line is checked first (server.trust.ImportCheck: 422 naming the first bad line, nothing
    added); the new records are stored unverified, used by this team's compiles alone until a farm worker of their
    host class has measured them."""
    limit = settings.max_upload_bytes
    storage.check_length(request.headers, limit)
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/"):
        stored = (await storage.receive_multipart(settings, content_type, request.stream(), limit)).file
    else:
        stored = await storage.save_stream(settings, request.stream(), limit)
    try:
        if not content_type and stored.size == 0:  # no body at all: an empty export is sent as one, with its type
            raise Invalid(
                "missing request body: send the JSON lines (Content-Type: application/x-ndjson) or a "
                "multipart/form-data body with a 'file' part",
                code="missing_body",
            )
        return await run_in_threadpool(_import, settings, stored.path, who.team_id)
    finally:
        storage.discard(stored)
