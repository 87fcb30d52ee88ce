"""Cost control: GPU prices per model and pool, each job attempt's priced GPUs, and budgets per queue.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "prices",
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("pool", sa.String(16), nullable=False),
        sa.Column("shown_model", sa.String(), nullable=False),
        sa.Column("usd_per_gpu_hour", sa.Float(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("model", "pool", name="pk_prices"),
    )
    op.create_table(
        "charges",
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("pool", sa.String(16), nullable=False),
        sa.Column("gpus", sa.Float(), nullable=False),
        sa.Column("usd_per_gpu_hour", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_charges_job_id_jobs"),
        sa.PrimaryKeyConstraint("job_id", "started_at", "model", "pool", name="pk_charges"),
    )
    op.create_table(
        "budgets",
        sa.Column("queue", sa.String(), nullable=False),
        sa.Column("amount", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(16), nullable=False),
        sa.Column("period", sa.String(16), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("level", sa.String(16), nullable=False, server_default="ok"),
        sa.Column("level_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("queue", name="pk_budgets"),
    )


def downgrade() -> None:
    op.drop_table("budgets")
    op.drop_table("charges")
    op.drop_table("prices")
