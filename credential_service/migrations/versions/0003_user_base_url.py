"""a user's own base URL on the model credential (reference §10.5)

Revision ID: 0003_user_base_url
Revises: 0002_binary_collation
Create Date: 2027-01-20

A nullable ``base_url`` column: existing rows keep going to their provider's
configured endpoint. On MySQL/MariaDB the column takes the table's binary collation
(0002).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_user_base_url"
down_revision: str | None = "0002_binary_collation"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("ai_model_credentials", sa.Column("base_url", sa.String(2048), nullable=True))


def downgrade() -> None:
    op.drop_column("ai_model_credentials", "base_url")
