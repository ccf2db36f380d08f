"""the learner's data: knowledge points that can be deleted, erased users' quota use

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 14:00:00

``ai_weak_point_candidates.knowledge_point_id`` becomes nullable: deleting a
knowledge point keeps the items that named it, with ``knowledgePointId`` null
(reference §9.2), as the quiz questions and flashcards already allowed.

``ai_runtime_erased_usage`` holds, per UTC day, how many jobs users since erased
(``DELETE /v1/me``) had created, under a keyed one-way pseudonym of their id: the
daily quota counts it, so an erasure does not reset the day's quota use.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from airuntime_common.db import convert_to_binary_collation

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("ai_weak_point_candidates") as batch:
        batch.alter_column("knowledge_point_id", existing_type=sa.String(64), nullable=True)
    op.create_table(
        "ai_runtime_erased_usage",
        sa.Column("pseudonym", sa.String(64), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("jobs", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("pseudonym", "day", name="pk_ai_runtime_erased_usage"),
    )
    convert_to_binary_collation(op.get_bind())


def downgrade() -> None:
    op.drop_table("ai_runtime_erased_usage")
    op.execute("DELETE FROM ai_weak_point_candidates WHERE knowledge_point_id IS NULL")
    with op.batch_alter_table("ai_weak_point_candidates") as batch:
        batch.alter_column("knowledge_point_id", existing_type=sa.String(64), nullable=False)
