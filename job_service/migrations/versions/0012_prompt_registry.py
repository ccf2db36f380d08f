"""the prompt registry: versions, routings, feedback; the prompt version of each model call

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-08 10:00:00

Reference §10.4. New tables: ``ai_prompt_versions`` (the uploaded template
versions, immutable), ``ai_prompt_routings`` (one row per job type with a
routing) and ``ai_result_feedback`` (learners' ratings of their generated items).
``ai_runtime_invocation_logs.prompt_version`` records the version each call's
attempt ran (NULL on older rows), with ``ix_invocations_type_created`` for the
stats of one job type over a window.

A job's ``promptVersion`` is ``<jobType>.<version>`` with a version of up to 64
characters, so ``ai_runtime_jobs.prompt_version`` and ``ai_results.prompt_version``
widen from 64 to 128 characters (on MariaDB/MySQL an in-place change: both lengths
take a two-byte length prefix in utf8mb4; SQLite does not enforce a length, so
its columns are left as they are). Jobs not yet ended that have no version get
``<jobType>.v1``, the template they were going to run.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from airuntime_common.db import convert_to_binary_collation

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _micro() -> sa.types.TypeEngine[object]:
    return (
        sa.DateTime()
        .with_variant(mysql.DATETIME(fsp=6), "mariadb")
        .with_variant(mysql.DATETIME(fsp=6), "mysql")
    )


def _source() -> sa.types.TypeEngine[object]:
    return (
        sa.Text()
        .with_variant(mysql.MEDIUMTEXT(), "mariadb")
        .with_variant(mysql.MEDIUMTEXT(), "mysql")
    )


def _widen(table: str, old: int, new: int) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    op.alter_column(
        table,
        "prompt_version",
        existing_type=sa.String(length=old),
        type_=sa.String(length=new),
        existing_nullable=True,
    )


def upgrade() -> None:
    op.create_table(
        "ai_prompt_versions",
        sa.Column("job_type", sa.String(length=32), nullable=False),
        sa.Column("version", sa.String(length=64), nullable=False),
        sa.Column("template", _source(), nullable=False),
        sa.Column("template_hash", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("created_at", _micro(), nullable=False),
        sa.Column("created_by", sa.String(length=160), nullable=False),
        sa.PrimaryKeyConstraint("job_type", "version", name=op.f("pk_ai_prompt_versions")),
    )
    op.create_table(
        "ai_prompt_routings",
        sa.Column("job_type", sa.String(length=32), nullable=False),
        sa.Column("routing_id", sa.String(length=64), nullable=False),
        sa.Column("variants", sa.JSON(), nullable=False),
        sa.Column("guard", sa.JSON(), nullable=False),
        sa.Column("revision", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("started_at", _micro(), nullable=False),
        sa.Column("updated_at", _micro(), nullable=False),
        sa.Column("updated_by", sa.String(length=160), nullable=False),
        sa.Column("rolled_back_at", _micro(), nullable=True),
        sa.Column("rollback_reason", sa.Text(), nullable=True),
        sa.Column("rolled_back_version", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("job_type", name=op.f("pk_ai_prompt_routings")),
    )
    op.create_table(
        "ai_result_feedback",
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("item_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("job_type", sa.String(length=32), nullable=False),
        sa.Column("prompt_version", sa.String(length=128), nullable=True),
        sa.Column("rating", sa.SmallInteger(), nullable=False),
        sa.Column("created_at", _micro(), nullable=False),
        sa.Column("updated_at", _micro(), nullable=False),
        sa.CheckConstraint("rating IN (1, -1)", name=op.f("ck_ai_result_feedback_rating_is_one")),
        sa.PrimaryKeyConstraint("user_id", "kind", "item_id", name=op.f("pk_ai_result_feedback")),
    )
    op.create_index(
        "ix_result_feedback_type_updated", "ai_result_feedback", ["job_type", "updated_at"]
    )
    with op.batch_alter_table("ai_runtime_invocation_logs") as batch:
        batch.add_column(sa.Column("prompt_version", sa.String(length=128), nullable=True))
    op.create_index(
        "ix_invocations_type_created", "ai_runtime_invocation_logs", ["job_type", "created_at"]
    )
    _widen("ai_runtime_jobs", 64, 128)
    _widen("ai_results", 64, 128)
    jobs = sa.table(
        "ai_runtime_jobs",
        sa.column("job_type", sa.String()),
        sa.column("status", sa.String()),
        sa.column("prompt_version", sa.String()),
    )
    op.execute(
        jobs.update()
        .where(
            jobs.c.prompt_version.is_(None),
            jobs.c.status.in_(("pending", "locked", "running")),
        )
        .values(prompt_version=jobs.c.job_type + sa.literal(".v1"))
    )
    convert_to_binary_collation(op.get_bind())  # the new tables' ids compare exactly


def downgrade() -> None:
    """Drops the registry's tables and the calls' versions. The widened columns stay
    128 characters long (a job's ``<jobType>.<version>`` may now be longer than 64)."""
    op.drop_index("ix_invocations_type_created", table_name="ai_runtime_invocation_logs")
    with op.batch_alter_table("ai_runtime_invocation_logs") as batch:
        batch.drop_column("prompt_version")
    op.drop_index("ix_result_feedback_type_updated", table_name="ai_result_feedback")
    op.drop_table("ai_result_feedback")
    op.drop_table("ai_prompt_routings")
    op.drop_table("ai_prompt_versions")
