"""Trust at every door: api_tokens.role (admin manages tokens and imports records, member tunes and compiles; the
tokens made before are admins, as every token could do everything), tuning_records.verified (false for an imported
record until a farm worker of its host class re-measures its schedule; true for the records made before) and
tuning_records.imported_by (the team that imported it), and jobs.lease_until (the search worker's lease on a running
job: a job whose lease ran out has no live owner and is re-queued or failed).

Revision ID: 0007
Revises: 0006
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("role", sa.String(16), nullable=False, server_default="admin"))
    with op.batch_alter_table("tuning_records") as batch:
        batch.add_column(sa.Column("verified", sa.Boolean(), nullable=False, server_default=sa.true()))
        batch.add_column(sa.Column("imported_by", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            op.f("fk_tuning_records_imported_by_teams"), "teams", ["imported_by"], ["id"], ondelete="SET NULL"
        )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("lease_until")
    with op.batch_alter_table("tuning_records") as batch:
        batch.drop_constraint(op.f("fk_tuning_records_imported_by_teams"), type_="foreignkey")
        batch.drop_column("imported_by")
        batch.drop_column("verified")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("role")
