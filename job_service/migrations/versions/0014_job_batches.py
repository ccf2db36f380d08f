"""job batches: a child's parent and a parent's counts of its children

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 10:00:00

A batch (reference §10.3) is a parent job row and its children, ordinary jobs
that name it in ``parent_job_id``. The parent carries its children's counts by
state (``batch_total``, ``batch_pending``, ``batch_running``, ``batch_succeeded``,
``batch_failed``, ``batch_cancelled``) and ``min_success_ratio``; every other
row leaves them NULL. ``ix_jobs_parent`` (parent_job_id, status) pages a
parent's children and finds its live ones. Nullable columns with no default:
adding them changes no existing row (an instant ALTER on MariaDB).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The counts of a parent, every one a nullable integer.
COUNTS = (
    "batch_total",
    "batch_pending",
    "batch_running",
    "batch_succeeded",
    "batch_failed",
    "batch_cancelled",
)


def upgrade() -> None:
    with op.batch_alter_table("ai_runtime_jobs") as batch:
        batch.add_column(sa.Column("parent_job_id", sa.String(64), nullable=True))
        for name in COUNTS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))
        batch.add_column(sa.Column("min_success_ratio", sa.Double(), nullable=True))
    op.create_index("ix_jobs_parent", "ai_runtime_jobs", ["parent_job_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_parent", table_name="ai_runtime_jobs")
    with op.batch_alter_table("ai_runtime_jobs") as batch:
        batch.drop_column("min_success_ratio")
        for name in reversed(COUNTS):
            batch.drop_column(name)
        batch.drop_column("parent_job_id")
