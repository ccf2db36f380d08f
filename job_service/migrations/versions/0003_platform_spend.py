"""platform-key spend per UTC day (the budget check reads it instead of the log)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 08:00:00

The new table starts with every day the invocation log already holds (one row
per day, shard 0), so the budget of the day of the upgrade still counts the
calls logged before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MICRO = (
    sa.DateTime()
    .with_variant(mysql.DATETIME(fsp=6), "mariadb")
    .with_variant(mysql.DATETIME(fsp=6), "mysql")
)


def upgrade() -> None:
    spend = op.create_table(
        "ai_runtime_platform_spend",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("cost_usd", sa.Numeric(precision=20, scale=8), nullable=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", MICRO, nullable=False),
        sa.PrimaryKeyConstraint("day", "shard", name=op.f("pk_ai_runtime_platform_spend")),
    )
    assert spend is not None
    log = sa.table(
        "ai_runtime_invocation_logs",
        sa.column("api_key_mode", sa.String()),
        sa.column("cost_usd", sa.Numeric(20, 8)),
        sa.column("created_at", MICRO),
    )
    day = sa.func.date(log.c.created_at)
    op.execute(
        spend.insert().from_select(
            ["day", "shard", "cost_usd", "calls", "updated_at"],
            sa.select(
                day,
                sa.literal(0, sa.SmallInteger()),
                sa.func.coalesce(sa.func.sum(log.c.cost_usd), 0),
                sa.func.count(),
                sa.func.max(log.c.created_at),
            )
            .where(log.c.api_key_mode == "platform_key")
            .group_by(day),
        )
    )


def downgrade() -> None:
    op.drop_table("ai_runtime_platform_spend")
