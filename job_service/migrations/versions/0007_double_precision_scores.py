"""double precision for the scores and dwell seconds on MySQL/MariaDB

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 03:25:00

``ai_learning_analyses.mastery_level``, ``ai_weak_point_candidates.severity`` and
``learning_events.dwell_seconds`` were ``FLOAT`` there: single precision, so a
model's ``masteryLevel`` 0.123456789 was read back as 0.123457, unlike the output
its ``outputHash`` covers (and unlike SQLite, whose REAL is a double). They become
``DOUBLE``; every FLOAT value is exactly representable as a DOUBLE, so the rows keep
their values. SQLite: no-op.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (table, column, nullable)
COLUMNS = (
    ("ai_learning_analyses", "mastery_level", False),
    ("ai_weak_point_candidates", "severity", False),
    ("learning_events", "dwell_seconds", True),
)


def _alter(old: sa.types.TypeEngine[float], new: sa.types.TypeEngine[float]) -> None:
    if op.get_bind().dialect.name not in ("mysql", "mariadb"):
        return
    for table, column, nullable in COLUMNS:
        op.alter_column(table, column, existing_type=old, type_=new, existing_nullable=nullable)


def upgrade() -> None:
    _alter(sa.Float(), sa.Double())


def downgrade() -> None:
    _alter(sa.Double(), sa.Float())
