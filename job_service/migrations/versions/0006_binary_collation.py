"""exact (binary, no-pad) comparison of ids and text on MySQL/MariaDB

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 22:10:00

The tables took the server's default collation (``utf8mb4_general_ci`` on MariaDB),
which folds case, accents and trailing spaces: user ``VIC1`` matched ``vic1``'s
materials, jobs and authorization, runtime instance ``INST-A`` passed ``inst-a``'s
fencing, ``Idempotency-Key: Key-1`` replayed ``key-1``'s job, and event ``E1`` was a
duplicate of ``e1``. Every table now defaults to a binary NO PAD collation and every
utf8mb4 text column takes it (:func:`airuntime_common.db.convert_to_binary_collation`).
Rows that differ only by case now no longer collide, so nothing can fail here.
SQLite compares bytes already: no-op there.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from airuntime_common.db import convert_to_binary_collation

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    convert_to_binary_collation(op.get_bind())


def downgrade() -> None:
    """Kept as is: returning to a case-folding collation would re-open the id
    collisions above (and could fail on ids that now differ only by case)."""
