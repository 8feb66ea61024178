"""A team's uploaded models: registering one (checked by the compiler's ONNX frontend, its tasks described in the
records database), the model object the API shows (tasks, and the records' coverage for a host class), and which
host class and target a job, a compile or a coverage question is about."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import exists, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from compiler.base.errors import InvalidTarget
from compiler.base.target import Target
from compiler.costs.records import cache_preference, target_name
from compiler.model.onnx_import import Budget, load, parse_input_shapes
from compiler.search.task_scheduler import TRIALS_PER_TASK, coverage
from compiler.targets import host_target as this_host_target
from compiler.targets import parse_target
from compiler.targets.cuda.target import choices as cuda_choices
from compiler.targets.cuda.target import is_cuda
from compiler.tensor import dag_json
from compiler.tensor.dag import ComputeDAG
from compiler.tensor.tasks import Task, constant_bytes, tuning_plan
from server import archive, storage
from server.database import SQLDatabase, this_host
from server.db import session_scope
from server.models import Host, ModelTask, UploadedModel, WorkerRow, Workload
from server.schemas import CoverageOut, Invalid, ModelOut, ModelTaskOut, NotFound, TaskCoverageOut, as_utc
from server.settings import Settings

TARGET_ALIASES = ("llvm", "cpu", "host")  # LLVM for the CPU of the host class; "cuda [-arch=...]" names a GPU class
NAME_CHARS = 255


@functools.cache
def records_db(url: str) -> SQLDatabase:
    """The records database on the service's own database, one per URL and process."""
    return SQLDatabase(url)


# ---------------------------------------------------------------------------------------------- host classes


def is_alive(worker: WorkerRow, settings: Settings, now: datetime | None = None) -> bool:
    now = now or datetime.now(UTC)
    grace = timedelta(seconds=settings.worker_grace_s)
    return not worker.stopped and now - as_utc(worker.last_heartbeat) <= grace


def default_host(session: Session, settings: Settings) -> str:
    """The fingerprint of the live CPU measurement workers when they all share one, else this server's own (a GPU
    worker's host class is a cuda target's: resolve_gpu_target)."""
    workers = session.scalars(
        select(WorkerRow).where(
            WorkerRow.stopped.is_(False), WorkerRow.fingerprint.is_not(None), WorkerRow.kind == "cpu"
        )
    )
    fingerprints = {w.fingerprint for w in workers if is_alive(w, settings)}
    return str(fingerprints.pop()) if len(fingerprints) == 1 else this_host()


def _target(fields: Mapping[str, Any]) -> Target | None:
    known = {f.name for f in dataclasses.fields(Target)}
    try:
        return Target(**{k: v for k, v in fields.items() if k in known})
    except TypeError:
        return None


def host_target(session: Session, settings: Settings, fingerprint: str) -> Target:
    """The Target of a host class: as a worker of it stored it (live ones first), this server's own, or rebuilt from
    the host row its records came with. Only one whose fingerprint is `fingerprint` will do: records are filed
    under it, so another would answer coverage for the wrong machines."""
    workers = list(
        session.scalars(select(WorkerRow).where(WorkerRow.fingerprint == fingerprint, WorkerRow.target.is_not(None)))
    )
    workers.sort(key=lambda w: (is_alive(w, settings), as_utc(w.last_heartbeat)), reverse=True)
    for w in workers:
        target = _target(w.target) if isinstance(w.target, dict) else None
        if target is not None and target.fingerprint() == fingerprint:
            return target
    if fingerprint == this_host():
        return this_host_target()
    host = session.scalar(select(Host).where(Host.fingerprint == fingerprint))
    if host is not None and host.mcpu:
        target = Target(
            kind=host.kind or "cpu",
            mcpu=host.mcpu,
            features=host.isa_features or "",
            cores=host.cores or 1,
            cpu_model=host.cpu_model or "",
            l1_bytes=host.l1_bytes,
            l2_bytes=host.l2_bytes,
            l3_bytes=host.l3_bytes,
        )
        if target.fingerprint() == fingerprint:
            return target
    raise Invalid(
        f"unknown host {fingerprint!r}: no worker has registered with this fingerprint and no records describe it; "
        "start `tilefarm worker` on such a machine (GET /api/v1/workers lists the known ones)",
        code="unknown_host",
    )


def resolve_target(session: Session, settings: Settings, target: str, host: str | None) -> Target:
    """The Target a job or compile asks for: `target` must be an alias of llvm, or a tvmc target string naming the host
    class's own CPU ("llvm -mcpu=<its mcpu>"): the service measures and builds on the host class's workers, so another
    CPU is refused (`tilefarm compile --target` cross-compiles); `host` defaults to default_host. A cuda target
    ("cuda", "cuda -arch=sm_80") is a GPU host class's instead (resolve_gpu_target)."""
    words = target.split()
    if is_cuda(target):
        return resolve_gpu_target(session, settings, target, host)
    if not words or words[0].lower() not in TARGET_ALIASES:
        raise Invalid(
            f"target {target!r} is not supported: use llvm (code for the CPU of the host class) or cuda "
            f"[-arch={cuda_choices()}] (a GPU host class's)",
            code="unsupported_target",
        )
    host_class = host_target(session, settings, host or default_host(session, settings))
    if host_class.kind != "cpu":
        raise Invalid(
            f"host {host!r} is a GPU host class ({target_name(host_class)}): ask for target cuda to tune or compile "
            "for it, or name a CPU host class for llvm",
            code="unsupported_target",
        )
    try:
        wanted = parse_target(target, host_class) if len(words) > 1 else host_class
    except InvalidTarget as e:
        raise Invalid(str(e), code="unsupported_target") from None
    if wanted != host_class:
        raise Invalid(
            f"target {target!r} is another CPU than the host class's ({target_name(host_class)}): the service tunes "
            f"and compiles for the CPU of the workers that measure; cross-compile on your own machine with "
            f"tilefarm compile --target {target!r}",
            code="unsupported_target",
        )
    return host_class


def resolve_gpu_target(session: Session, settings: Settings, target: str, host: str | None) -> Target:
    """The Target of the GPU host class a cuda job or compile is for: `host` when given (a GPU of the architecture
    `target` names), else the one GPU class of that architecture with live workers, else the one heard from last
    (its job waits for a worker, as a CPU job does). 422 naming what is wrong: a bad -arch, a host that is a CPU or
    another architecture, no GPU worker of the architecture ever registered, or several live (name one)."""
    try:
        wanted = parse_target(target)
    except InvalidTarget as e:
        raise Invalid(str(e), code="unsupported_target") from None
    name = target_name(wanted)
    if host is not None:
        host_class = host_target(session, settings, host)
        if host_class.kind != wanted.kind or host_class.mcpu != wanted.mcpu:
            what = f"a GPU of cuda -arch={host_class.mcpu}" if host_class.kind == wanted.kind else "a CPU host class"
            raise Invalid(
                f"host {host!r} is {what}, not one of {name}: name a GPU host class of that architecture "
                "(GET /api/v1/workers lists them)",
                code="unsupported_target",
            )
        return host_class
    gpus = session.scalars(
        select(WorkerRow).where(WorkerRow.kind == "gpu", WorkerRow.fingerprint.is_not(None)).order_by(WorkerRow.id)
    )
    classes: dict[str, tuple[bool, datetime, Target]] = {}  # fingerprint -> (alive, last heard, its Target)
    for w in gpus:
        t = _target(w.target) if isinstance(w.target, dict) else None
        if t is None or t.kind != wanted.kind or t.mcpu != wanted.mcpu or t.fingerprint() != w.fingerprint:
            continue
        seen = classes.get(t.fingerprint())
        here = (is_alive(w, settings), as_utc(w.last_heartbeat), t)
        if seen is None or here[:2] > seen[:2]:
            classes[t.fingerprint()] = here
    if not classes:
        raise Invalid(
            f"no GPU worker for {name} has registered: start `tilefarm worker --role measure --gpu 0` on a machine "
            f"with such a GPU (compose: `docker compose --profile gpu up -d worker-gpu`); `tilefarm compile --target "
            f"{target!r}` builds without one",
            code="unknown_host",
        )
    live = [c for c in classes.values() if c[0]]
    if len(live) > 1:
        named = ", ".join(f"{t.fingerprint()} ({t.cpu_model})" for _, _, t in live)
        raise Invalid(
            f"{len(live)} GPU host classes of {name} have live workers: name one as host ({named})",
            code="ambiguous_host",
        )
    return live[0][2] if live else max(classes.values(), key=lambda c: c[1])[2]


# ---------------------------------------------------------------------------------------------- registering


def parse_shapes(text: str | None) -> dict[str, list[int]] | None:
    """The `input_shapes` form field: a JSON object ({"input": [1, 3, 224, 224]}) or the CLI's x:[1,3,224,224]."""
    if text is None or not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return parse_input_shapes(text)
    except RecursionError:  # nested past Python's stack
        raise Invalid("input_shapes: nested too deeply") from None

    def dims(v: object) -> bool:
        return isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v)

    if not isinstance(value, dict) or not all(dims(v) for v in value.values()):
        raise Invalid(
            "input_shapes: expected a JSON object of input name to a list of non-negative integers, e.g. "
            '{"input": [1, 3, 224, 224]}'
        )
    return value


def model_budget(settings: Settings) -> Budget:
    """What checking an upload may allocate in the API process, named by the service's own settings; the workers load
    a model under the same budget, since one that leaves a fold to run time makes other tasks than a larger one."""
    return Budget(
        value_bytes=settings.max_model_value_bytes,
        fold_bytes=settings.max_model_fold_bytes,
        nodes=settings.max_model_nodes,
        prefix="TILEFARM_MAX_MODEL_",
    )


def find_model(session: Session, team_id: int, sha256: str) -> UploadedModel | None:
    return session.scalar(select(UploadedModel).where(UploadedModel.team_id == team_id, UploadedModel.sha256 == sha256))


def register_model(
    settings: Settings,
    team_id: int,
    upload: storage.StoredFile,
    name: str,
    input_shapes: dict[str, list[int]] | None,
) -> tuple[ModelOut, bool]:
    """Register an upload (an .onnx, or an archive of one and its external data files: server.archive) as a model of
    the team; returns its model object and whether the team had it already. The upload must load and split into tasks
    (a TilefarmError says why not); on any failure no row and no file are left behind."""
    unpacked = None
    try:
        with session_scope(settings, write=False) as session:
            model = find_model(session, team_id, upload.sha256)
            if model is not None:
                return model_view(session, settings, model), True
        # an archive is unpacked (the model and its external data files); a plain .onnx must not reference any
        if archive.is_archive(upload.path):
            unpacked = archive.unpack(upload.path, storage.scratch_path(settings), settings.max_upload_bytes)
            proto = archive.read_model(unpacked.folder / unpacked.model, unpacked.member)
        else:
            proto = archive.read_upload(upload.path, "the upload")
        # a ModelProto, not the path: the frontend's messages would name the server's storage folder
        # the tasks a job tunes, its convs' other forms included (weight 0), as `tilefarm tune` does by default
        graph = load(proto, input_shapes, model_budget(settings))
        del proto  # the graph holds the weights now: the plan's passes make their copies without the proto beside them
        plan = tuning_plan(graph)
        del graph
        tasks = plan.all_tasks
        records_db(settings.database_url).describe_workloads(tasks)  # committed on its own: shared, idempotent
        if unpacked is None:
            path, created = storage.keep(settings, upload)
        else:
            path, created = storage.keep_unpacked(settings, unpacked.folder, unpacked.model, upload.sha256)
        try:
            with session_scope(settings) as session:
                model = UploadedModel(
                    team_id=team_id,
                    sha256=upload.sha256,
                    name=name[:NAME_CHARS],
                    size_bytes=upload.size,
                    path=str(path),
                    input_shapes=input_shapes,
                    weights_bytes=constant_bytes(plan.calls),
                )
                session.add(model)
                session.flush()
                keys = [t.key for t in tasks]
                found = session.execute(select(Workload.key, Workload.id).where(Workload.key.in_(keys))).all()
                ids: dict[str, int] = dict(found)
                session.add_all(
                    ModelTask(model_id=model.id, position=i, workload_id=ids[t.key], name=t.name, weight=t.weight)
                    for i, t in enumerate(tasks)
                )
        except BaseException as e:
            if created:
                _delete_unreferenced(settings, path)
            if isinstance(e, IntegrityError):  # the same bytes came in a concurrent upload of this team, first
                with session_scope(settings, write=False) as session:
                    existing = find_model(session, team_id, upload.sha256)
                    if existing is not None:
                        return model_view(session, settings, existing), True
            raise
        with session_scope(settings, write=False) as session:
            model = session.get_one(UploadedModel, model.id)
            return model_view(session, settings, model, tasks=tasks), False
    finally:
        storage.discard(upload)  # the temporary file, if it was not moved to its content address
        if unpacked is not None:
            shutil.rmtree(unpacked.folder, ignore_errors=True)  # likewise the unpacked folder


def _delete_unreferenced(settings: Settings, path: Path) -> None:
    """Delete a model file no row names (another team may have registered the same bytes meanwhile)."""
    with session_scope(settings, write=False) as session:
        if not session.scalar(select(exists().where(UploadedModel.path == str(path)))):
            storage.delete_model(settings, path)


# ---------------------------------------------------------------------------------------------- views


def get_model(session: Session, team_id: int, model_id: int) -> UploadedModel:
    """A model of the team; another team's id is as unknown as a missing one."""
    model = session.get(UploadedModel, model_id)
    if model is None or model.team_id != team_id:
        raise NotFound(f"no model {model_id}")
    return model


def list_models(session: Session, team_id: int) -> list[ModelOut]:
    models = session.scalars(
        select(UploadedModel).where(UploadedModel.team_id == team_id).order_by(UploadedModel.id.desc())
    )
    return [model_view(session, None, m) for m in models]


@functools.lru_cache(maxsize=1024)
def workload_dag(key: str, text: str) -> ComputeDAG:
    """A workload's stored DAG (Workload.dag_json) rebuilt; DAGFormatError if it does not read back as `key`."""
    return dag_json.from_json(text, key)


def _task_rows(session: Session, model_id: int) -> list[tuple[ModelTask, Workload]]:
    q = (
        select(ModelTask, Workload)
        .join(Workload, Workload.id == ModelTask.workload_id)
        .where(ModelTask.model_id == model_id)
        .order_by(ModelTask.position)
    )
    return [(mt, w) for mt, w in session.execute(q)]


def model_tasks(settings: Settings, model: UploadedModel, rows: list[tuple[ModelTask, Workload]]) -> list[Task]:
    """The model's tasks rebuilt from their stored DAGs; the model is loaded again only if one does not rebuild."""
    try:
        return [Task(w.key, workload_dag(w.key, w.dag_json or ""), mt.name, mt.weight) for mt, w in rows]
    except dag_json.DAGFormatError:
        proto = archive.read_model(storage.resolve(settings, model.path), model.name)
        graph = load(proto, model.input_shapes, model_budget(settings))
        return tuning_plan(graph).all_tasks


def coverage_view(
    session: Session,
    settings: Settings,
    tasks: list[Task],
    fingerprint: str,
    weights_bytes: int | None = None,
    team_id: int | None = None,
) -> CoverageOut:
    """What the records team `team_id` trusts (server.trust) hold for each task on one host class, and the trials
    still needed (task_scheduler.coverage); the best record of each task is the one compile applies for a model of
    `weights_bytes` of constants."""
    target = host_target(session, settings, fingerprint)
    prefer = cache_preference(weights_bytes or 0, target)
    records = records_db(settings.database_url).trusting(team_id)
    covered = coverage(tasks, records, target, TRIALS_PER_TASK, prefer)
    rows = [
        TaskCoverageOut(
            position=i,
            records=c.valid,
            best_latency_s=c.best.mean_cost if c.best is not None else None,
            trials_needed=c.trials_needed,
        )
        for i, c in enumerate(covered)
    ]
    return CoverageOut(
        host=fingerprint,
        target=target_name(target),
        tasks=rows,
        trials_needed=sum(c.trials_needed for c in covered),
        tuned_tasks=sum(1 for c in covered if c.trials_needed == 0),
    )


def model_view(
    session: Session,
    settings: Settings | None,
    model: UploadedModel,
    host: str | None = None,
    tasks: list[Task] | None = None,
) -> ModelOut:
    """The model object; with settings, its coverage on `host` (default: the default host)."""
    rows = _task_rows(session, model.id)
    cover = None
    if settings is not None:
        tasks = tasks if tasks is not None else model_tasks(settings, model, rows)
        host = host or default_host(session, settings)
        cover = coverage_view(session, settings, tasks, host, model.weights_bytes, model.team_id)
    return ModelOut(
        id=model.id,
        name=model.name,
        sha256=model.sha256,
        size_bytes=model.size_bytes,
        input_shapes=model.input_shapes,
        created_at=model.created_at,
        tasks=[
            ModelTaskOut(position=mt.position, name=mt.name, workload_key=w.key, weight=mt.weight, flops=w.flops)
            for mt, w in rows
        ],
        coverage=cover,
    )
