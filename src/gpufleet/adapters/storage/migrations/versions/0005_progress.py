"""What jobs report about themselves: a bounded progress history per job (throughput per size, loss curve,
checkpoints).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "job_progress",
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_job_progress_job_id_jobs"),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_progress"),
    )


def downgrade() -> None:
    op.drop_table("job_progress")
