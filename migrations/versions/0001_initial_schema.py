"""initial schema: workloads, hosts, targets, tuning records, uploaded models and their tasks, artifacts

Revision ID: 0001
Revises:
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=True),
        sa.Column("cpu_model", sa.String(length=255), nullable=True),
        sa.Column("mcpu", sa.String(length=64), nullable=True),
        sa.Column("isa_features", sa.Text(), nullable=True),
        sa.Column("cores", sa.Integer(), nullable=True),
        sa.Column("l1_bytes", sa.Integer(), nullable=True),
        sa.Column("l2_bytes", sa.Integer(), nullable=True),
        sa.Column("l3_bytes", sa.Integer(), nullable=True),
        sa.Column("gpu", sa.String(length=255), nullable=True),
        sa.Column("npu", sa.String(length=255), nullable=True),
        sa.Column("tilefarm_version", sa.String(length=32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hosts")),
        sa.UniqueConstraint("fingerprint", name=op.f("uq_hosts_fingerprint")),
    )
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("input_shapes", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("sha256", name=op.f("uq_models_sha256")),
    )
    op.create_table(
        "targets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_targets")),
        sa.UniqueConstraint("name", name=op.f("uq_targets_name")),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("dag_text", sa.Text(), nullable=True),
        sa.Column("op_tag", sa.String(length=128), nullable=True),
        sa.Column("flops", sa.BigInteger(), nullable=True),
        sa.Column("shapes", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workloads")),
        sa.UniqueConstraint("key", name=op.f("uq_workloads_key")),
    )
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=True),
        sa.Column("target_id", sa.Integer(), nullable=True),
        sa.Column("records_used", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_artifacts_model_id_models"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"], name=op.f("fk_artifacts_target_id_targets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
    )
    op.create_index(op.f("ix_artifacts_model_id"), "artifacts", ["model_id"], unique=False)
    op.create_index(op.f("ix_artifacts_sha256"), "artifacts", ["sha256"], unique=False)

    op.create_table(
        "model_tasks",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_model_tasks_model_id_models"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], name=op.f("fk_model_tasks_workload_id_workloads")),
        sa.PrimaryKeyConstraint("model_id", "workload_id", name=op.f("pk_model_tasks")),
    )
    op.create_index(op.f("ix_model_tasks_workload_id"), "model_tasks", ["workload_id"], unique=False)

    op.create_table(
        "tuning_records",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("host_id", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Text(), nullable=False),
        sa.Column("steps_hash", sa.String(length=64), nullable=False),
        sa.Column("costs", sa.JSON(), nullable=False),
        sa.Column("mean_cost", sa.Float(), nullable=True),
        sa.Column("error", sa.String(length=32), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.Column("build_seconds", sa.Float(), nullable=True),
        sa.Column("run_seconds", sa.Float(), nullable=True),
        sa.Column("timestamp", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=True),
        sa.Column("version", sa.String(length=32), nullable=False),
        sa.Column("trace", sa.JSON(none_as_null=True), nullable=True),
        sa.ForeignKeyConstraint(["host_id"], ["hosts.id"], name=op.f("fk_tuning_records_host_id_hosts")),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"], name=op.f("fk_tuning_records_target_id_targets")),
        sa.ForeignKeyConstraint(
            ["workload_id"], ["workloads.id"], name=op.f("fk_tuning_records_workload_id_workloads")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tuning_records")),
        sa.UniqueConstraint(
            "workload_id", "host_id", "steps_hash", name=op.f("uq_tuning_records_workload_id_host_id_steps_hash")
        ),
    )
    op.create_index(
        "ix_tuning_records_best", "tuning_records", ["workload_id", "target_id", "host_id", "mean_cost"], unique=False
    )
    op.create_index("ix_tuning_records_training", "tuning_records", ["host_id", "workload_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_tuning_records_training", table_name="tuning_records")
    op.drop_index("ix_tuning_records_best", table_name="tuning_records")

    op.drop_table("tuning_records")
    op.drop_index(op.f("ix_model_tasks_workload_id"), table_name="model_tasks")

    op.drop_table("model_tasks")
    op.drop_index(op.f("ix_artifacts_sha256"), table_name="artifacts")
    op.drop_index(op.f("ix_artifacts_model_id"), table_name="artifacts")

    op.drop_table("artifacts")
    op.drop_table("workloads")
    op.drop_table("targets")
    op.drop_table("models")
    op.drop_table("hosts")
