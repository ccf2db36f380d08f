"""fair order across users and provider rate limits (reference §10.1, §10.2)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 20:30:00

* ``ai_runtime_jobs.vstart``: a job's virtual start in its priority's fair order;
  jobs already waiting get 0, so they keep their order among themselves (createdAt).
* ``ai_runtime_jobs.parked_until``: a pending job out of the claim's index range until
  then (a retry's backoff, no provider with room); the jobs waiting for their
  ``availableAt`` now are parked until it.
* ``ix_jobs_poll`` becomes (status, parked_until, priority, vstart, created_at, seq): the
  claim reads its range ``status='pending' AND parked_until IS NULL`` in its order,
  the scheduler the range ``parked_until <= now``. ``ix_jobs_user_waiting`` (user_id,
  status, priority, vstart) finds a user's newest waiting job at a priority.
* ``ai_circuit_breaker.paused_until`` and ``grants``, ``ai_provider_grants`` and
  ``ai_credential_pauses``: the state of the provider limits, shared by every replica.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from airuntime_common.db import convert_to_binary_collation

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MICRO = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("ai_runtime_jobs") as batch:
        batch.add_column(sa.Column("vstart", sa.Double(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("parked_until", MICRO, nullable=True))
    op.execute(
        "UPDATE ai_runtime_jobs SET parked_until = available_at"
        " WHERE status = 'pending' AND available_at > "
        + ("CURRENT_TIMESTAMP" if op.get_context().dialect.name == "sqlite" else "UTC_TIMESTAMP(6)")
    )
    op.drop_index("ix_jobs_poll", table_name="ai_runtime_jobs")
    op.create_index(
        "ix_jobs_poll",
        "ai_runtime_jobs",
        ["status", "parked_until", "priority", "vstart", "created_at", "seq"],
    )
    op.create_index(
        "ix_jobs_user_waiting", "ai_runtime_jobs", ["user_id", "status", "priority", "vstart"]
    )
    with op.batch_alter_table("ai_circuit_breaker") as batch:
        batch.add_column(sa.Column("paused_until", MICRO, nullable=True))
        batch.add_column(sa.Column("grants", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_table(
        "ai_provider_grants",
        sa.Column("seq", SEQ, autoincrement=True, nullable=False),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("attempt_no", sa.Integer(), nullable=False),
        sa.Column("granted_at", MICRO, nullable=False),
        sa.Column("tokens_reserved", sa.BigInteger(), nullable=False),
        sa.Column("tokens_used", sa.BigInteger(), nullable=True),
        sa.Column("ended_at", MICRO, nullable=True),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_ai_provider_grants")),
    )
    op.create_index("ix_provider_grants_window", "ai_provider_grants", ["provider", "granted_at"])
    op.create_index("ix_provider_grants_job", "ai_provider_grants", ["job_id", "attempt_no"])
    op.create_index("ix_provider_grants_age", "ai_provider_grants", ["granted_at"])
    op.create_table(
        "ai_credential_pauses",
        sa.Column("credential_id", sa.String(64), nullable=False),
        sa.Column("paused_until", MICRO, nullable=False),
        sa.PrimaryKeyConstraint("credential_id", name=op.f("pk_ai_credential_pauses")),
    )
    convert_to_binary_collation(op.get_bind())


def downgrade() -> None:
    op.drop_table("ai_credential_pauses")
    op.drop_index("ix_provider_grants_age", table_name="ai_provider_grants")
    op.drop_index("ix_provider_grants_job", table_name="ai_provider_grants")
    op.drop_index("ix_provider_grants_window", table_name="ai_provider_grants")
    op.drop_table("ai_provider_grants")
    with op.batch_alter_table("ai_circuit_breaker") as batch:
        batch.drop_column("grants")
        batch.drop_column("paused_until")
    op.drop_index("ix_jobs_user_waiting", table_name="ai_runtime_jobs")
    op.drop_index("ix_jobs_poll", table_name="ai_runtime_jobs")
    op.create_index("ix_jobs_poll", "ai_runtime_jobs", ["status", "priority", "created_at", "seq"])
    with op.batch_alter_table("ai_runtime_jobs") as batch:
        batch.drop_column("parked_until")
        batch.drop_column("vstart")
