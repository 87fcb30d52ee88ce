"""The first schema: jobs, their transitions and requests, queues, nodes, tokens, settings and counters.

Revision ID: 0001
Revises:
Create Date: 2026-05-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

AutoId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("queue", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.UniqueConstraint("seq", name="uq_jobs_seq"),
    )
    op.create_index("ix_jobs_state_seq", "jobs", ["state", "seq"])
    op.create_index("ix_jobs_queue_seq", "jobs", ["queue", "seq"])
    op.create_index("ix_jobs_name_seq", "jobs", ["name", "seq"])

    op.create_table(
        "transitions",
        sa.Column("id", AutoId, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("target", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_transitions_job_id_jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_transitions"),
    )
    op.create_index("ix_transitions_job_id_id", "transitions", ["job_id", "id"])

    op.create_table(
        "requests",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_requests_job_id_jobs"),
        sa.PrimaryKeyConstraint("seq", name="pk_requests"),
    )

    op.create_table(
        "queues",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_queues"),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_nodes"),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("queue", sa.String(), nullable=True),
        sa.Column("secret_hash", sa.String(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tokens"),
        sa.UniqueConstraint("secret_hash", name="uq_tokens_secret_hash"),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_settings"),
    )
    meta = op.create_table(
        "meta",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_meta"),
    )
    # The counters start here: cluster version 1 (as the in-memory store), no job or request numbered yet.
    op.bulk_insert(
        meta,
        [
            {"key": "cluster_version", "value": 1},
            {"key": "submit_seq", "value": 0},
            {"key": "request_seq", "value": 0},
        ],
    )


def downgrade() -> None:
    for table in ("meta", "settings", "tokens", "nodes", "queues", "requests", "transitions", "jobs"):
        op.drop_table(table)
