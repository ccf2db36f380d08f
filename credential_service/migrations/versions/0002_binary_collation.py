"""exact (binary, no-pad) comparison of user ids on MySQL/MariaDB

Revision ID: 0002_binary_collation
Revises: 0001_ai_model_credentials
Create Date: 2026-12-01

With the server's default ``utf8mb4_general_ci`` user ``VIC1`` read, replaced and
deleted ``vic1``'s key, and a ``user_deepseek_key`` job of ``VIC1`` would run on it.
The table now defaults to a binary NO PAD collation and its utf8mb4 text columns take
it (:func:`airuntime_common.db.convert_to_binary_collation`; the ascii base64 columns
are binary already). No-op on SQLite.
"""

from collections.abc import Sequence

from alembic import op

from airuntime_common.db import convert_to_binary_collation

revision: str = "0002_binary_collation"
down_revision: str | None = "0001_ai_model_credentials"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    convert_to_binary_collation(op.get_bind())


def downgrade() -> None:
    """Kept as is (see the module doc)."""
