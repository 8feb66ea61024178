"""The SQL schema (SQLAlchemy 2.0 declarative models). Every change here needs an Alembic migration in
`migrations/versions/`; tests/test_sql_database.py checks that autogenerate finds nothing left to migrate."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
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
    dag_json: Mapped[str | None] = mapped_column(Text)  # the whole DAG (compiler.dag_json): what training needs
    op_tag: Mapped[str | None] = mapped_column(String(128))  # what the task is called, e.g. "conv2d_add_relu"
    flops: Mapped[int | None] = mapped_column(BigInteger)
    shapes: Mapped[Any | None] = mapped_column(JSON)  # {"T0": [1, 64, 56, 56], ...}: every stage's shape


class Host(Base):
    """A machine class timings are valid for: records from hosts with another fingerprint are not comparable."""

    __tablename__ = "hosts"
    id: Mapped[int] = mapped_column(primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)  # compiler.target.Target.fingerprint()
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
    """One measured schedule: compiler.records.TuningRecord, with its workload, target and host as rows."""

    __tablename__ = "tuning_records"
    __table_args__ = (
        # a redelivered measurement (same schedule for the same workload on the same host) is one record
        UniqueConstraint("workload_id", "host_id", "steps_hash"),
        Index("ix_tuning_records_best", "workload_id", "target_id", "host_id", "mean_cost"),
        Index("ix_tuning_records_training", "host_id", "workload_id"),
    )
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    target_id: Mapped[int] = mapped_column(ForeignKey("targets.id"))
    host_id: Mapped[int] = mapped_column(ForeignKey("hosts.id"))
    steps: Mapped[str] = mapped_column(Text)  # the step records as compact JSON (TuningRecord.identity's form)
    steps_hash: Mapped[str] = mapped_column(String(64))  # sha256 of `steps`
    costs: Mapped[list[float]] = mapped_column(JSON)  # seconds per run, one per repeat
    mean_cost: Mapped[float | None] = mapped_column(Float)  # NULL for a failed measurement
    error: Mapped[str | None] = mapped_column(String(32))  # "build", "run", "timeout", "wrong_answer"
    error_message: Mapped[str] = mapped_column(Text, default="")
    build_seconds: Mapped[float | None] = mapped_column(Float)
    run_seconds: Mapped[float | None] = mapped_column(Float)
    timestamp: Mapped[float] = mapped_column(Float)  # when it was measured, seconds since the epoch (exact)
    created_by: Mapped[str | None] = mapped_column(String(255))
    version: Mapped[str] = mapped_column(String(32))  # tilefarm version that measured it
    trace: Mapped[Any | None] = mapped_column(JSON(none_as_null=True))  # how the search made it


class UploadedModel(Base):
    """A model file uploaded to the service (identified by the sha256 of its bytes)."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(255))
    input_shapes: Mapped[Any | None] = mapped_column(JSON)  # {"input": [1, 3, 224, 224]}
    created_at: Mapped[datetime] = _created_at()


class ModelTask(Base):
    """A model calls a workload `weight` times."""

    __tablename__ = "model_tasks"
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), primary_key=True, index=True)
    weight: Mapped[int] = mapped_column(Integer, default=1)


class ArtifactRow(Base):
    """A compiled artifact (.tar) and the records it was built from."""

    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    path: Mapped[str] = mapped_column(Text)
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="SET NULL"), index=True)
    target_id: Mapped[int | None] = mapped_column(ForeignKey("targets.id"))
    records_used: Mapped[Any | None] = mapped_column(JSON)  # meta.json's "records": one entry per tuned task
    created_at: Mapped[datetime] = _created_at()
