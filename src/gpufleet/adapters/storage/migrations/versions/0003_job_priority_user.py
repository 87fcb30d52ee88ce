"""Jobs get `priority` and `username` (who submitted it) as columns beside their JSON record, for the
dashboard's listings by submitter and for ranking a waiting job in its queue without decoding the queue.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("username", sa.String(), nullable=False, server_default=""))
    jobs = sa.table("jobs", sa.column("record", sa.JSON()), sa.column("priority"), sa.column("username"))
    # Records written before: their priority from the JSON; no submitter was recorded, so "" (unknown).
    op.execute(jobs.update().values(priority=sa.func.coalesce(jobs.c.record["job"]["priority"].as_integer(), 0)))
    op.create_index("ix_jobs_queue_state_priority_seq", "jobs", ["queue", "state", "priority", "seq"])
    op.create_index("ix_jobs_username_seq", "jobs", ["username", "seq"])


def downgrade() -> None:
    op.drop_index("ix_jobs_username_seq", table_name="jobs")
    op.drop_index("ix_jobs_queue_state_priority_seq", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("username")
        batch.drop_column("priority")
