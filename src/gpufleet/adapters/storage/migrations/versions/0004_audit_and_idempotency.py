"""The audit log of admin actions and the idempotency keys of submits.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

AutoId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", AutoId, autoincrement=True, nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("token_id", sa.String(), nullable=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("source", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit"),
    )
    op.create_index("ix_audit_at", "audit", ["at"])

    op.create_table(
        "idempotency_keys",
        sa.Column("token_id", sa.String(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("body_hash", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_idempotency_keys_job_id_jobs"),
        sa.PrimaryKeyConstraint("token_id", "key", name="pk_idempotency_keys"),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_index("ix_audit_at", table_name="audit")
    op.drop_table("audit")
