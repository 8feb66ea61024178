"""tuning_records.cache: the cache condition a record was timed in ("warm", "cold-weights", "flushed"); the same
schedule timed in two conditions is two records, so the unique key takes the column too. Records stored before were
timed warm.

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KEY = ["workload_id", "host_id", "steps_hash"]


def upgrade() -> None:
    with op.batch_alter_table("tuning_records") as batch:
        batch.add_column(sa.Column("cache", sa.String(length=16), server_default="warm", nullable=False))
        batch.drop_constraint(op.f("uq_tuning_records_workload_id_host_id_steps_hash"), type_="unique")
        batch.create_unique_constraint(
            op.f("uq_tuning_records_workload_id_host_id_steps_hash_cache"), [*OLD_KEY, "cache"]
        )


def downgrade() -> None:
    # the same schedule timed in two conditions cannot stay two records under the old key: keep the first stored
    op.execute(
        "DELETE FROM tuning_records WHERE id NOT IN "
        "(SELECT MIN(id) FROM tuning_records GROUP BY workload_id, host_id, steps_hash)"
    )
    with op.batch_alter_table("tuning_records") as batch:
        batch.drop_constraint(op.f("uq_tuning_records_workload_id_host_id_steps_hash_cache"), type_="unique")
        batch.create_unique_constraint(op.f("uq_tuning_records_workload_id_host_id_steps_hash"), OLD_KEY)
        batch.drop_column("cache")
