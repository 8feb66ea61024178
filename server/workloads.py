"""The records database seen by workload and host class: which of a team's model tasks are tuned on which hosts (the
coverage heatmap), the workloads browser with each host's best, and one record's schedule printed as a loop nest.
Each answer is a few grouped queries, never one per task or per workload."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import ColumnElement, case, func, or_, select
from sqlalchemy.orm import Session

from compiler.base.errors import TilefarmError
from compiler.schedule.loopir import print_func
from compiler.schedule.lower import lower
from compiler.schedule.state import apply_steps, step_from_record
from server.catalog import TARGET_ALIASES, is_alive, workload_dag
from server.database import trusted_by
from server.models import Host, ModelTask, Record, TargetRow, UploadedModel, WorkerRow, Workload
from server.schemas import (
    CoverageHost,
    CoverageMatrix,
    Invalid,
    ModelCoverageRow,
    NotFound,
    ScheduleOut,
    WorkloadHostOut,
    WorkloadOrder,
    WorkloadOut,
    WorkloadPage,
)
from server.settings import Settings

# ---------------------------------------------------------------------------------------------- coverage


def _host_classes(session: Session, settings: Settings) -> list[dict[str, Any]]:
    """Every host class with records or a registered measuring worker: the ones with live workers first."""
    hosts: dict[str, dict[str, Any]] = {}
    for row in session.execute(select(Host.id, Host.fingerprint, Host.cpu_model, Host.kind, Host.mcpu)):
        hosts[row.fingerprint] = {"id": row.id, "cpu_model": row.cpu_model, "kind": row.kind, "mcpu": row.mcpu}
    workers = session.scalars(
        select(WorkerRow).where(WorkerRow.fingerprint.is_not(None), WorkerRow.kind != "search").order_by(WorkerRow.id)
    )
    alive: dict[str, int] = {}
    for w in workers:
        fp = str(w.fingerprint)
        target = w.target if isinstance(w.target, dict) else {}
        h = hosts.setdefault(fp, {"id": None, "cpu_model": None, "kind": None, "mcpu": None})
        h["cpu_model"] = h["cpu_model"] or target.get("cpu_model") or None
        h["kind"] = h["kind"] or w.kind
        h["mcpu"] = h["mcpu"] or target.get("mcpu") or None
        alive[fp] = alive.get(fp, 0) + is_alive(w, settings)
    out = [{"fingerprint": fp, "alive_workers": alive.get(fp, 0), **h} for fp, h in hosts.items()]
    return sorted(out, key=lambda h: (h["alive_workers"] == 0, h["fingerprint"]))


def _own_target(h: dict[str, Any]) -> str | None:
    """The target a host class's records are filed under for its own hardware: "llvm -mcpu=<its CPU>", or for a
    GPU's "cuda -arch=<its architecture>" (compiler.costs.records.target_name); None where not known."""
    if not h["mcpu"]:
        return None
    return f"cuda -arch={h['mcpu']}" if h["kind"] in ("gpu", "cuda") else f"llvm -mcpu={h['mcpu']}"


def coverage_matrix(session: Session, settings: Settings, team_id: int, target: str = "llvm") -> CoverageMatrix:
    """The team's models x every host class: a task is tuned on a host when it has an error-free record measured
    there for the target that the team may use (verified, or its own import: server.trust). `target` is llvm (each
    host's own CPU: "llvm -mcpu=<its mcpu>") or a full target name."""
    wanted = target.strip()
    alias = wanted.lower() in TARGET_ALIASES
    if not alias and not wanted.startswith("llvm "):
        raise Invalid(
            f"target {target!r} is not supported yet: use llvm or a name like 'llvm -mcpu=znver4'",
            code="unsupported_target",
        )
    hosts = _host_classes(session, settings)
    for h in hosts:  # None: the host's CPU is not known, so any llvm target of its records counts
        h["target"] = _own_target(h) if alias else wanted
    targets = dict(session.execute(select(TargetRow.id, TargetRow.name)).all())
    # one grouped query: which (host, target, model, task) pairs have an error-free record
    tuned_rows = session.execute(
        select(Record.host_id, Record.target_id, ModelTask.model_id, ModelTask.position)
        .join(ModelTask, ModelTask.workload_id == Record.workload_id)
        .join(UploadedModel, UploadedModel.id == ModelTask.model_id)
        .where(UploadedModel.team_id == team_id, Record.mean_cost.is_not(None), trusted_by(team_id))
        .group_by(Record.host_id, Record.target_id, ModelTask.model_id, ModelTask.position)
    ).all()
    column = {h["id"]: i for i, h in enumerate(hosts) if h["id"] is not None}
    tuned: set[tuple[int, int, int]] = set()  # (host column, model id, position)
    for host_id, target_id, model_id, position in tuned_rows:
        i = column.get(host_id)
        if i is None:
            continue
        name, want = targets.get(target_id, ""), hosts[i]["target"]
        if name == want or (want is None and name.startswith("llvm")):
            tuned.add((i, model_id, position))
    models = session.execute(
        select(UploadedModel.id, UploadedModel.name, func.count(ModelTask.position))
        .outerjoin(ModelTask, ModelTask.model_id == UploadedModel.id)
        .where(UploadedModel.team_id == team_id)
        .group_by(UploadedModel.id, UploadedModel.name)
        .order_by(UploadedModel.id.desc())
    ).all()
    rows = []
    for model_id, name, n in models:
        grid = [[(i, model_id, p) in tuned for p in range(n)] for i in range(len(hosts))]
        rows.append(ModelCoverageRow(id=model_id, name=name, tasks=n, tuned=[sum(g) for g in grid], task_tuned=grid))
    return CoverageMatrix(
        hosts=[
            CoverageHost(
                fingerprint=h["fingerprint"],
                cpu_model=h["cpu_model"],
                kind=h["kind"],
                alive_workers=h["alive_workers"],
                target=h["target"],
            )
            for h in hosts
        ],
        models=rows,
    )


# ---------------------------------------------------------------------------------------------- workloads


def browse_workloads(
    session: Session,
    *,
    offset: int = 0,
    limit: int = 50,
    q: str | None = None,
    order: WorkloadOrder = "-records",
    team_id: int | None = None,
) -> WorkloadPage:
    """A page of workloads (shared by every team) with their record counts and each host class's fastest record
    that team `team_id` may use (verified, or its own import); `q` matches a substring of the op tag or the key,
    ignoring case."""
    counts = select(Record.workload_id, func.count().label("n")).group_by(Record.workload_id).subquery()
    n = func.coalesce(counts.c.n, 0).label("records")
    where: list[ColumnElement[bool]] = []
    text = (q or "").strip()
    if text:
        where.append(or_(*(c.icontains(text, autoescape=True) for c in (Workload.op_tag, Workload.key))))
    total = session.scalar(select(func.count()).select_from(Workload).where(*where)) or 0
    ordering = {
        "records": (n, Workload.id),
        "-records": (n.desc(), Workload.id),
        "flops": (Workload.flops.is_(None), Workload.flops, Workload.id),
        "-flops": (Workload.flops.is_(None), Workload.flops.desc(), Workload.id),
    }[order]
    page = session.execute(
        select(Workload.id, Workload.key, Workload.op_tag, Workload.flops, Workload.shapes, n)
        .outerjoin(counts, counts.c.workload_id == Workload.id)
        .where(*where)
        .order_by(*ordering)
        .limit(limit)
        .offset(offset)
    ).all()
    per_host = _per_host(session, [r.id for r in page], team_id)
    return WorkloadPage(
        total=total,
        workloads=[
            WorkloadOut(
                key=r.key,
                op_tag=r.op_tag,
                flops=r.flops,
                shapes=r.shapes,
                records=r.records,
                hosts=per_host.get(r.id, []),
            )
            for r in page
        ],
    )


def _per_host(session: Session, workload_ids: list[int], team_id: int | None) -> dict[int, list[WorkloadHostOut]]:
    """Per workload, per host class: how many records (how many unverified), and the fastest error-free one that
    team `team_id` may use (two grouped queries)."""
    if not workload_ids:
        return {}
    unverified = func.sum(case((Record.verified.is_(False), 1), else_=0))
    counts = session.execute(
        select(Record.workload_id, Host.fingerprint, Host.id, func.count(), unverified)
        .join(Host, Host.id == Record.host_id)
        .where(Record.workload_id.in_(workload_ids))
        .group_by(Record.workload_id, Host.fingerprint, Host.id)
        .order_by(Record.workload_id, Host.fingerprint)
    ).all()
    rank = (
        func.row_number()
        .over(partition_by=(Record.workload_id, Record.host_id), order_by=(Record.mean_cost, Record.id))
        .label("rank")
    )
    fastest = (
        select(Record.id, Record.workload_id, Record.host_id, Record.mean_cost, Record.verified, rank)
        .where(Record.workload_id.in_(workload_ids), Record.mean_cost.is_not(None), trusted_by(team_id))
        .subquery()
    )
    best = {
        (w, h): (i, cost, verified)
        for i, w, h, cost, verified in session.execute(
            select(
                fastest.c.id, fastest.c.workload_id, fastest.c.host_id, fastest.c.mean_cost, fastest.c.verified
            ).where(fastest.c.rank == 1)
        )
    }
    out: dict[int, list[WorkloadHostOut]] = {}
    for workload_id, fingerprint, host_id, n, n_unverified in counts:
        record_id, cost, verified = best.get((workload_id, host_id), (None, None, None))
        out.setdefault(workload_id, []).append(
            WorkloadHostOut(
                host=fingerprint,
                records=n,
                best_latency_s=cost,
                best_record_id=record_id,
                best_verified=verified,
                unverified=n_unverified or 0,
            )
        )
    return out


# ---------------------------------------------------------------------------------------------- schedules


def record_schedule(session: Session, record_id: int) -> ScheduleOut:
    """A record's steps replayed on its workload's stored DAG and lowered to loop IR, printed; 422 when the steps
    do not replay (a record of another tilefarm version, or a malformed import) or the DAG is not stored."""
    row = session.execute(
        select(
            Record.id,
            Record.steps,
            Record.mean_cost,
            Workload.key,
            Workload.op_tag,
            Workload.dag_json,
            Host.fingerprint,
            TargetRow.name,
            Record.verified,
            Record.imported_by,
        )  # fmt: skip
        .join(Workload, Workload.id == Record.workload_id)
        .join(Host, Host.id == Record.host_id)
        .join(TargetRow, TargetRow.id == Record.target_id)
        .where(Record.id == record_id)
    ).first()
    if row is None:
        raise NotFound(f"no record {record_id}")
    steps = json.loads(row.steps)
    if row.dag_json is None:
        raise Invalid(
            f"workload {row.key} has no stored DAG (its records were imported before a model with it was uploaded)",
            code="no_dag",
        )
    try:
        dag = workload_dag(row.key, row.dag_json)
    except TilefarmError as e:
        raise Invalid(f"workload {row.key}'s stored DAG does not read back: {e}", code="no_dag") from None
    try:
        state = apply_steps(dag, [step_from_record(s) for s in steps])
        loop_nest = print_func(lower(state))
    except (TilefarmError, ValueError, TypeError, IndexError, KeyError) as e:
        raise Invalid(
            f"record {record_id}'s steps do not replay on its workload {row.key}: {e}", code="schedule_does_not_replay"
        ) from None
    return ScheduleOut(
        record_id=row.id,
        workload_key=row.key,
        op_tag=row.op_tag,
        host=row.fingerprint,
        target=row.name,
        mean_cost=row.mean_cost,
        steps=steps,
        loop_nest=loop_nest,
        verified=row.verified,
        imported_by=row.imported_by,
    )
