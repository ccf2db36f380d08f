"""Alembic environment of job_service (async engine; SQLite batch mode)."""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

import job_service.learning.tables
import job_service.prompts.tables
import job_service.store.tables  # noqa: F401  (the job core's tables)
from airuntime_common.db import migration_lock
from airuntime_common.settings import DEFAULT_JOB_DB
from job_service.store.base import Base
from job_service.store.engine import make_job_engine

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    return str(
        config.attributes.get("url")
        or config.get_main_option("sqlalchemy.url")
        or os.environ.get("DATABASE_URL")
        or DEFAULT_JOB_DB
    )


def _configure(**kw: Any) -> None:
    url = _url()
    context.configure(
        target_metadata=target_metadata,
        render_as_batch=url.startswith("sqlite"),
        compare_type=True,
        **kw,
    )


def run_migrations_offline() -> None:
    """Emit SQL without a database connection."""
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_sync(connection: Connection) -> None:
    # replicas starting together migrate one at a time (the later ones find head)
    with migration_lock(connection, "airuntime_job_service_migrate"):
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()


async def run_migrations_online() -> None:
    """Run against the configured database with the async engine."""
    engine = make_job_engine(_url())
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run_sync)
            await conn.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
