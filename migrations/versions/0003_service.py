"""the service: teams and API tokens, uploaded models (per team) and their tasks, tuning jobs with their
convergence points and measurement batches, workers, artifacts (per team, with a build state). The models,
model_tasks and artifacts tables of 0001 were never written by any release, so they are replaced, not altered.

Revision ID: 0003
Revises: 0002
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index(op.f("ix_model_tasks_workload_id"), table_name="model_tasks")
    op.drop_table("model_tasks")
    op.drop_index(op.f("ix_artifacts_sha256"), table_name="artifacts")
    op.drop_index(op.f("ix_artifacts_model_id"), table_name="artifacts")
    op.drop_table("artifacts")
    op.drop_table("models")
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("target", sa.JSON(), nullable=True),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("hostname", sa.String(length=255), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("last_heartbeat", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("measurements_done", sa.Integer(), nullable=False),
        sa.Column("current_batch", sa.String(length=64), nullable=True),
        sa.Column("stopped", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
        sa.UniqueConstraint("name", name=op.f("uq_workers_name")),
    )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workers_fingerprint"), ["fingerprint"], unique=False)

    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("prefix", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_api_tokens_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_api_tokens_token_hash")),
    )
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_api_tokens_team_id"), ["team_id"], unique=False)

    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("input_shapes", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_models_team_id_teams"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("team_id", "sha256", name=op.f("uq_models_team_id_sha256")),
    )
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_models_team_id"), ["team_id"], unique=False)

    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=64), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("records_used", sa.JSON(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_artifacts_model_id_models"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_artifacts_team_id_teams"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
    )
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_artifacts_model_id"), ["model_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_artifacts_sha256"), ["sha256"], unique=False)
        batch_op.create_index(batch_op.f("ix_artifacts_team_id"), ["team_id"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("host", sa.String(length=64), nullable=False),
        sa.Column("queue", sa.String(length=128), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("time_budget_s", sa.Float(), nullable=True),
        sa.Column("per_round", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("trials_done", sa.Integer(), nullable=False),
        sa.Column("tuning_s", sa.Float(), nullable=False),
        sa.Column("estimated_latency", sa.Float(), nullable=True),
        sa.Column("tasks", sa.JSON(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name=op.f("fk_jobs_model_id_models"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["team_id"], ["teams.id"], name=op.f("fk_jobs_team_id_teams"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_model_id"), ["model_id"], unique=False)
        batch_op.create_index("ix_jobs_team_state", ["team_id", "state"], unique=False)

    op.create_table(
        "model_tasks",
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"], ["models.id"], name=op.f("fk_model_tasks_model_id_models"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], name=op.f("fk_model_tasks_workload_id_workloads")),
        sa.PrimaryKeyConstraint("model_id", "position", name=op.f("pk_model_tasks")),
    )
    with op.batch_alter_table("model_tasks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_tasks_workload_id"), ["workload_id"], unique=False)

    op.create_table(
        "job_points",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("elapsed_s", sa.Float(), nullable=False),
        sa.Column("estimated_latency", sa.Float(), nullable=True),
        sa.Column("task", sa.Integer(), nullable=True),
        sa.Column("task_best", sa.JSON(), nullable=True),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_job_points_job_id_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_points")),
    )
    with op.batch_alter_table("job_points", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_points_job_id"), ["job_id"], unique=False)

    op.create_table(
        "measure_batches",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("task", sa.Integer(), nullable=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("queue", sa.String(length=128), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=False),
        sa.Column("errors", sa.JSON(), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_measure_batches_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measure_batches")),
    )
    with op.batch_alter_table("measure_batches", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_measure_batches_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("measure_batches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_measure_batches_job_id"))

    op.drop_table("measure_batches")
    with op.batch_alter_table("job_points", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_points_job_id"))

    op.drop_table("job_points")
    with op.batch_alter_table("model_tasks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_tasks_workload_id"))

    op.drop_table("model_tasks")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_team_state")
        batch_op.drop_index(batch_op.f("ix_jobs_model_id"))

    op.drop_table("jobs")
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_artifacts_team_id"))
        batch_op.drop_index(batch_op.f("ix_artifacts_sha256"))
        batch_op.drop_index(batch_op.f("ix_artifacts_model_id"))

    op.drop_table("artifacts")
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_models_team_id"))

    op.drop_table("models")
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_api_tokens_team_id"))

    op.drop_table("api_tokens")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workers_fingerprint"))

    op.drop_table("workers")
    op.drop_table("teams")
    _create_0001_tables()


def _create_0001_tables() -> None:
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
