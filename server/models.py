"""The SQL schema (SQLAlchemy 2.0 declarative models). Every change here needs an Alembic migration in
`migrations/versions/`; tests/test_sql_database.py checks that autogenerate finds nothing left to migrate."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# explicit constraint names, so migrations can refer to them and autogenerate compares them on every dialect
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _created_at() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class Workload(Base):
    """One ComputeDAG, identified by its workload key; the descriptive columns are filled when a task is known."""

    __tablename__ = "workloads"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    dag_text: Mapped[str | None] = mapped_column(Text)  # ComputeDAG.canonical_text
    dag_json: Mapped[str | None] = mapped_column(Text)  # the whole DAG (compiler.tensor.dag_json): what training needs
    op_tag: Mapped[str | None] = mapped_column(String(128))  # what the task is called, e.g. "conv2d_add_relu"
    flops: Mapped[int | None] = mapped_column(BigInteger)
    shapes: Mapped[Any | None] = mapped_column(JSON)  # {"T0": [1, 64, 56, 56], ...}: every stage's shape


class Host(Base):
    """A machine class timings are valid for: records from hosts with another fingerprint are not comparable."""

    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)  # compiler.base.target.Target.fingerprint()
    kind: Mapped[str | None] = mapped_column(String(16))  # cpu, gpu, npu
    cpu_model: Mapped[str | None] = mapped_column(String(255))
    mcpu: Mapped[str | None] = mapped_column(String(64))  # LLVM's CPU name, e.g. znver4
    isa_features: Mapped[str | None] = mapped_column(Text)  # LLVM feature string, sorted
    cores: Mapped[int | None] = mapped_column(Integer)
    l1_bytes: Mapped[int | None] = mapped_column(Integer)
    l2_bytes: Mapped[int | None] = mapped_column(Integer)
    l3_bytes: Mapped[int | None] = mapped_column(Integer)
    gpu: Mapped[str | None] = mapped_column(String(255))
    npu: Mapped[str | None] = mapped_column(String(255))
    tilefarm_version: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = _created_at()


class TargetRow(Base):
    """A code generation target as records name it, e.g. "llvm -mcpu=znver4"."""

    __tablename__ = "targets"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)


class Record(Base):
    """One measured schedule: compiler.costs.records.TuningRecord, with its workload, target and host as rows."""

    __tablename__ = "tuning_records"
    __table_args__ = (
        # a redelivered measurement (same schedule for the same workload on the same host, timed in the same cache
        # condition) is one record
        UniqueConstraint("workload_id", "host_id", "steps_hash", "cache"),
        Index("ix_tuning_records_best", "workload_id", "target_id", "host_id", "mean_cost"),
        Index("ix_tuning_records_training", "host_id", "workload_id"),
        # a job's records in commit order, paged (the dashboard's records table)
        Index("ix_tuning_records_job", "job_id", "id"),
    )
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    steps: Mapped[str] = mapped_column(Text)  # the step records as compact JSON (TuningRecord.identity's form)
    steps_hash: Mapped[str] = mapped_column(String(64))  # sha256 of `steps`
    costs: Mapped[list[float]] = mapped_column(JSON)  # seconds per run, one per repeat
    mean_cost: Mapped[float | None] = mapped_column(Float)  # NULL for a failed measurement
    # the cache condition it was timed in: "warm", "cold-weights" or "flushed" (compiler.costs.records.CACHE_CONDITIONS)
    cache: Mapped[str] = mapped_column(String(16), default="warm", server_default="warm")
    error: Mapped[str | None] = mapped_column(String(32))  # "build", "run", "timeout", "wrong_answer"
    error_message: Mapped[str] = mapped_column(Text, default="")
    build_seconds: Mapped[float | None] = mapped_column(Float)
    run_seconds: Mapped[float | None] = mapped_column(Float)
    timestamp: Mapped[float] = mapped_column(Float)  # when it was measured, seconds since the epoch (exact)
    created_by: Mapped[str | None] = mapped_column(String(255))
    version: Mapped[str] = mapped_column(String(32))  # tilefarm version that measured it
    trace: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))  # how the search made it
    # the tuning job whose measurement made it (NULL: imported, tuned offline, or the job was deleted since)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    # false for an imported record until a farm worker of its host class has re-measured its schedule: until then
    # it chooses schedules for the team that imported it only
    verified: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    imported_by: Mapped[int | None] = mapped_column(ForeignKey("teams.id", ondelete="SET NULL"))


class Team(Base):
    """A team: it owns its models, jobs and artifacts; tuning records are shared by every team by design."""

    __tablename__ = "teams"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = _created_at()


class ApiToken(Base):
    """A bearer token of a team. Only its sha256 is stored; `prefix` (its first characters) names it in listings."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = _created_at()
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    role: Mapped[str] = mapped_column(String(16), default="member", server_default="admin")  # admin or member


class UploadedModel(Base):
    """An ONNX model a team uploaded; the same bytes uploaded twice by one team are one model."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("team_id", "sha256"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    sha256: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    path: Mapped[str] = mapped_column(Text)  # in the service's storage folder, shared with the workers
    input_shapes: Mapped[Any | None] = mapped_column(JSON)  # {"input": [1, 3, 224, 224]}
    # bytes of the constants its kernels read (tensor.tasks.constant_bytes): whether a run meets its weights cold
    # on a host (NULL: registered before it was counted; taken as fitting the cache)
    weights_bytes: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _created_at()


class ModelTask(Base):
    """Task `position` of a model (the order `tuning_plan` gives: the plan's tasks, then its convs' other forms) is a
    workload called `weight` times (0: a conv's other form, called only where compile finds it faster)."""

    __tablename__ = "model_tasks"
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    weight: Mapped[int] = mapped_column(Integer, default=1)


class Job(Base):
    """A tuning job: a model tuned on one host class (fingerprint) for a target, within a trial and time budget.

    States: queued -> running -> succeeded | failed | cancelled; cancelled and failed jobs can be resumed (queued
    again). `attempt` grows with every enqueue: a search task whose attempt is not the job's is stale and stops."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_team_state", "team_id", "state"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"))
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    target: Mapped[str] = mapped_column(String(255))  # e.g. "llvm -mcpu=znver4"
    host: Mapped[str] = mapped_column(String(64))  # the fingerprint of the measuring host class
    queue: Mapped[str] = mapped_column(String(128))  # measure.cpu.<fingerprint>
    trials: Mapped[int] = mapped_column(Integer)  # the budget of new measurements
    time_budget_s: Mapped[float | None] = mapped_column(Float)
    per_round: Mapped[int] = mapped_column(Integer, default=64)
    seed: Mapped[int] = mapped_column(Integer, default=0)
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    tuning_s: Mapped[float] = mapped_column(Float, default=0.0)  # wall time spent tuning, over every attempt
    estimated_latency: Mapped[float | None] = mapped_column(Float)  # seconds: sum of weight x best over tasks
    tasks: Mapped[Any | None] = mapped_column(JSON)  # the per-task table of the last round, a list of dicts
    error_message: Mapped[str] = mapped_column(Text, default="")
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))  # the worker running its search
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = _created_at()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the search worker's lease: renewed while it makes progress; a running job whose lease ran out has no live owner
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class JobPoint(Base):
    """One point of a job's convergence curve, written after every round."""

    __tablename__ = "job_points"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    trials: Mapped[int] = mapped_column(Integer)
    elapsed_s: Mapped[float] = mapped_column(Float)
    estimated_latency: Mapped[float | None] = mapped_column(Float)  # NULL while a task has no valid program
    task: Mapped[int | None] = mapped_column(Integer)  # the task position the round measured
    task_best: Mapped[Any | None] = mapped_column(JSON)  # best latency per task position (NULL: none yet)
    errors: Mapped[Any | None] = mapped_column(JSON)  # {"build": 2, ...} of this round
    created_at: Mapped[datetime] = _created_at()


class MeasureBatch(Base):
    """A batch of candidates sent to a measurement queue: who took it, when, and how it ended."""

    __tablename__ = "measure_batches"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # the Celery task id
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    task: Mapped[int | None] = mapped_column(Integer)  # the task position in the job's model
    size: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str] = mapped_column(String(128))
    worker: Mapped[str | None] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), default="sent")  # sent, running, done, lost, failed, cancelled
    try_number: Mapped[int] = mapped_column(Integer, default=1)
    errors: Mapped[Any | None] = mapped_column(JSON)
    sent_at: Mapped[datetime] = _created_at()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WorkerRow(Base):
    """A Celery worker process: what it measures on, which queues it serves, and when it was last alive."""

    __tablename__ = "workers"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)  # Celery's node name, e.g. measure@host
    kind: Mapped[str] = mapped_column(String(16))  # cpu, gpu, npu; "search" for a search-only worker
    fingerprint: Mapped[str | None] = mapped_column(String(64), index=True)
    target: Mapped[Any | None] = mapped_column(JSON)  # compiler.base.target.Target's fields
    # a GPU worker's GPU: name, SMs, compute capability, memory, CUDA and driver versions, clocks (GpuFingerprint)
    device: Mapped[Any | None] = mapped_column(JSON)
    queues: Mapped[Any] = mapped_column(JSON)
    pid: Mapped[int | None] = mapped_column(Integer)
    hostname: Mapped[str | None] = mapped_column(String(255))
    started_at: Mapped[datetime] = _created_at()
    last_heartbeat: Mapped[datetime] = _created_at()
    measurements_done: Mapped[int] = mapped_column(Integer, default=0)
    current_batch: Mapped[str | None] = mapped_column(String(64))
    stopped: Mapped[bool] = mapped_column(Boolean, default=False)  # a clean shutdown, as opposed to lost


class ArtifactRow(Base):
    """A compiled artifact (.tar) of a team's model: queued, building, ready (with its sha256) or failed."""

    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id", ondelete="CASCADE"), index=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    target: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(64))  # the host class its kernels were compiled and tuned for
    sha256: Mapped[str | None] = mapped_column(String(64), index=True)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    path: Mapped[str | None] = mapped_column(Text)
    records_used: Mapped[Any | None] = mapped_column(JSON)  # meta.json's "records": one entry per tuned task
    error_message: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = _created_at()
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # the worker building it: one that stops answering loses the build, which is queued again (workers.progress)
    worker: Mapped[str | None] = mapped_column(String(255))
