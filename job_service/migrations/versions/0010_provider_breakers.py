"""one platform-key breaker per model provider; the provider of a lease grant's events

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 13:40:00

``ai_circuit_breaker`` held one row (``id = 1``); it now holds one row per model
provider, keyed by the provider's name (reference §9.4: each provider has its own
breaker, shared by all replicas). The old row becomes the ``deepseek`` row (the
provider of the default ``MODEL_PROVIDERS``), state, count and times kept; the
rows of other configured providers are made by job_service at start.

``ai_runtime_job_events.model_provider`` names the provider an attempt was given,
on the events of its lease grant (NULL on every other event and on older rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = ("state", "consecutive_failures", "opened_at", "half_open_at", "probes_in_flight")


def _micro() -> sa.types.TypeEngine[object]:
    return (
        sa.DateTime()
        .with_variant(mysql.DATETIME(fsp=6), "mariadb")
        .with_variant(mysql.DATETIME(fsp=6), "mysql")
    )


def _breaker_table(key: sa.Column[object]) -> None:
    op.create_table(
        "ai_circuit_breaker",
        key,
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False),
        sa.Column("opened_at", _micro(), nullable=True),
        sa.Column("half_open_at", _micro(), nullable=True),
        sa.Column("probes_in_flight", sa.Integer(), nullable=False),
        sa.Column("updated_at", _micro(), nullable=True),
        sa.PrimaryKeyConstraint(key.name, name=op.f("pk_ai_circuit_breaker")),
    )


def _move(key: str, value: object, where: str) -> None:
    """Re-create the breaker table keyed by ``key``, carrying the row ``where`` picks."""
    conn = op.get_bind()
    cols = ", ".join(_COLUMNS)
    row = conn.execute(sa.text(f"SELECT {cols} FROM ai_circuit_breaker WHERE {where}")).first()
    op.drop_table("ai_circuit_breaker")
    if key == "provider":
        _breaker_table(sa.Column("provider", sa.String(length=32), nullable=False))
    else:
        _breaker_table(sa.Column("id", sa.Integer(), autoincrement=False, nullable=False))
    if row is not None:
        values = dict(zip(_COLUMNS, row, strict=True))
        names = ", ".join((key, *_COLUMNS))
        marks = ", ".join(f":{c}" for c in (key, *_COLUMNS))
        conn.execute(
            sa.text(f"INSERT INTO ai_circuit_breaker ({names}) VALUES ({marks})"),
            {key: value, **values},
        )


def upgrade() -> None:
    _move("provider", "deepseek", "id = 1")
    with op.batch_alter_table("ai_runtime_job_events") as batch:
        batch.add_column(sa.Column("model_provider", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("ai_runtime_job_events") as batch:
        batch.drop_column("model_provider")
    _move("id", 1, "provider = 'deepseek'")
