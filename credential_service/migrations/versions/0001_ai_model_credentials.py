"""Create ai_model_credentials.

Revision ID: 0001_ai_model_credentials
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0001_ai_model_credentials"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

B64 = sa.Text().with_variant(mysql.TEXT(charset="ascii", collation="ascii_bin"), "mysql", "mariadb")
TS = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "ai_model_credentials",
        sa.Column("credential_id", sa.String(64), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("provider", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        # base64 text (see credential_service.models.Base64Bytes)
        sa.Column("nonce", B64, nullable=False),
        sa.Column("ciphertext", B64, nullable=False),
        sa.Column("masked_key", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("invalid_reason", sa.String(500), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("credential_id", name="pk_ai_model_credentials"),
        sa.UniqueConstraint("user_id", name="uq_ai_model_credentials_user_id"),
        sa.CheckConstraint(
            "status IN ('valid', 'invalid')", name=op.f("ck_ai_model_credentials_status")
        ),
        mysql_charset="utf8mb4",
        mysql_engine="InnoDB",
    )
    op.create_index("ix_ai_model_credentials_key_id", "ai_model_credentials", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_ai_model_credentials_key_id", table_name="ai_model_credentials")
    op.drop_table("ai_model_credentials")
