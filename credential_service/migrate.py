"""Run credential_service's Alembic migrations to head (``python -m credential_service migrate``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection

from airuntime_common.db import make_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    """The Alembic config of this service (``migrations/alembic.ini`` inside the package)."""
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_locations", str(MIGRATIONS_DIR / "versions"))
    return cfg


def _upgrade_sync(connection: Connection) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, "head")


async def upgrade(url: str) -> None:
    """Upgrade the database at ``url`` to the latest revision (idempotent).

    Args:
        url: SQLAlchemy async URL (``CREDENTIAL_DATABASE_URL``).
    """
    engine = make_engine(url, pool_size=1)
    try:
        # not ``engine.begin()``: the migration lock commits the work before it lets the
        # next replica in (airuntime_common.db.migration_lock)
        async with engine.connect() as conn:
            await conn.run_sync(_upgrade_sync)
            await conn.commit()
    finally:
        await engine.dispose()
