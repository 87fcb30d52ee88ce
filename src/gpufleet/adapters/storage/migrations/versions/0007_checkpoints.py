"""Checkpoint cost model: a request may carry a number (a reported checkpoint's duration), and the work each
attempt lost when it ended by preemption, node loss or failure.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("value", sa.Float(), nullable=True))
    op.create_table(
        "attempt_losses",
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("cause", sa.String(16), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("ended_at", sa.Float(), nullable=False),
        sa.Column("lost_s", sa.Float(), nullable=False),
        sa.Column("gpus", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_attempt_losses_job_id_jobs"),
        sa.PrimaryKeyConstraint("job_id", "attempt", name="pk_attempt_losses"),
    )
    op.create_index("ix_attempt_losses_ended_at", "attempt_losses", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_attempt_losses_ended_at", table_name="attempt_losses")
    op.drop_table("attempt_losses")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("value")
