"""index for job lists filtered by status, newest first

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 08:20:00

``WHERE status = ? ORDER BY seq DESC`` (the admin list with a status filter)
sorted every job of that status ever written; with ``(status, seq)`` a page
reads its rows in order.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ai_runtime_jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_status_seq", ["status", "seq"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("ai_runtime_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_status_seq")
