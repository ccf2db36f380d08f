"""a version per job row (ETag), the create's trace context, admission locks by write

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 12:00:00

``ai_runtime_jobs.version`` counts the row's changes: every UPDATE of a job
(status, lease, cancelRequested, retry) adds one, so ``GET /v1/ai/jobs/{id}``
answers an ETag that follows every change (reference §9.1). Existing rows start at 0.

``ai_runtime_jobs.trace_parent`` is the W3C ``traceparent`` of the request that
created the job (55 characters), so every attempt's spans join the create's trace
(reference §9.5); NULL when the create was not traced.

``ai_user_admission_locks.changes`` is what a create, re-run or AI switch change
writes to take the user's admission lock: an UPDATE, not a ``SELECT … FOR UPDATE``,
so on a Galera cluster two nodes' admissions of one user conflict at certification
(a row lock alone is not replicated, reference §9.6); on one server the lock is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ai_runtime_jobs") as batch:
        batch.add_column(
            sa.Column("version", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
        )
        batch.add_column(sa.Column("trace_parent", sa.String(55), nullable=True))
    with op.batch_alter_table("ai_user_admission_locks") as batch:
        batch.add_column(
            sa.Column("changes", sa.BigInteger(), nullable=False, server_default=sa.text("0"))
        )


def downgrade() -> None:
    with op.batch_alter_table("ai_user_admission_locks") as batch:
        batch.drop_column("changes")
    with op.batch_alter_table("ai_runtime_jobs") as batch:
        batch.drop_column("trace_parent")
        batch.drop_column("version")
