"""covering indexes for the snapshot's reading and quiz aggregates

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 08:30:00

The snapshot built at every create sums the user's reading time per block and
quiz results per knowledge point. The old indexes, ``(user_id, material_id)`` and
``(user_id, knowledge_point_id)``, found the rows but not their values: every
event, of either type, cost a row lookup. The new ones lead with the event type
and hold every column the aggregates read, so they are read from the index alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("learning_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_learning_events_reading",
            ["user_id", "type", "material_id", "block_id", "dwell_seconds", "occurred_at"],
            unique=False,
        )
        batch_op.create_index(
            "ix_learning_events_quiz",
            ["user_id", "type", "knowledge_point_id", "correct", "occurred_at"],
            unique=False,
        )
        batch_op.drop_index("ix_learning_events_user_material")
        batch_op.drop_index("ix_learning_events_user_kp")


def downgrade() -> None:
    with op.batch_alter_table("learning_events", schema=None) as batch_op:
        batch_op.create_index(
            "ix_learning_events_user_kp", ["user_id", "knowledge_point_id"], unique=False
        )
        batch_op.create_index(
            "ix_learning_events_user_material", ["user_id", "material_id"], unique=False
        )
        batch_op.drop_index("ix_learning_events_quiz")
        batch_op.drop_index("ix_learning_events_reading")
