"""indexes of the operator console's reads: jobs by creation time and by end time

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 14:00:00

``ix_jobs_created_status`` (created_at, status) serves the console's job list
filtered by a creation time range with no user, and its counts per state
(``GROUP BY status`` over the range reads the index alone).
``ix_jobs_finished_status`` (finished_at, status) serves the jobs-per-minute
chart: the last hours' ended jobs by outcome, one range of the index (reference §9.5).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_created_status", "ai_runtime_jobs", ["created_at", "status"])
    op.create_index("ix_jobs_finished_status", "ai_runtime_jobs", ["finished_at", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_status", table_name="ai_runtime_jobs")
    op.drop_index("ix_jobs_created_status", table_name="ai_runtime_jobs")
