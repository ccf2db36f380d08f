"""per-user admission lock rows (atomic daily quota across replicas)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 16:05:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "ai_user_admission_locks",
        sa.Column("user_id", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_ai_user_admission_locks")),
    )


def downgrade() -> None:
    op.drop_table("ai_user_admission_locks")
