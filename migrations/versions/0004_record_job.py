"""tuning_records.job_id: the job whose measurement made a record (NULL for imported or offline ones, and once the
job is deleted), indexed with the id so a job's records page in commit order

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tuning_records") as batch:
        batch.add_column(sa.Column("job_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_tuning_records_job_id_jobs"), "jobs", ["job_id"], ["id"], ondelete="SET NULL")
        batch.create_index("ix_tuning_records_job", ["job_id", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tuning_records") as batch:
        batch.drop_index("ix_tuning_records_job")
        batch.drop_constraint(op.f("fk_tuning_records_job_id_jobs"), type_="foreignkey")
        batch.drop_column("job_id")
