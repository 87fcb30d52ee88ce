"""Jobs get `array_id` (the array a task belongs to, "" for a job of its own) as a column beside their JSON
record, so that a whole array is listed, counted and cancelled without decoding every job.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("array_id", sa.String(), nullable=False, server_default=""))
    op.create_index("ix_jobs_array_id_seq", "jobs", ["array_id", "seq"])


def downgrade() -> None:
    op.drop_index("ix_jobs_array_id_seq", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("array_id")
