"""`windows`: an admin's maintenance windows and GPUs held for a queue (`gpufleet reservation create`), one row
each, the whole window as JSON.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.create_table(
        "windows",
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_windows")),
    )


def downgrade() -> None:
    op.drop_table("windows")
