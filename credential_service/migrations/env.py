"""Alembic environment of credential_service (async).

Two ways in: :func:`credential_service.migrate.upgrade` passes an open connection in
``config.attributes["connection"]``; the ``alembic`` CLI (``alembic -c
credential_service/migrations/alembic.ini upgrade head``) connects with
``CREDENTIAL_DATABASE_URL``. The version table is ``credential_alembic_version`` so
this service can share a database with job_service.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from airuntime_common.db import make_engine, migration_lock
from credential_service.models import CredentialBase
from credential_service.settings import CredentialSettings

VERSION_TABLE = "credential_alembic_version"
config = context.config
target_metadata = CredentialBase.metadata


def _configure_and_run(connection: Connection) -> None:
    # replicas starting together migrate one at a time (the later ones find head)
    with migration_lock(connection, "airuntime_credential_service_migrate"):
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            version_table=VERSION_TABLE,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()


async def _run_async(url: str) -> None:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_configure_and_run)
            await conn.commit()
    finally:
        await engine.dispose()


def run_offline() -> None:
    """Emit SQL without a database (``alembic upgrade --sql``)."""
    context.configure(
        url=CredentialSettings().CREDENTIAL_DATABASE_URL,
        target_metadata=target_metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Run against the shared connection, or connect with ``CREDENTIAL_DATABASE_URL``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure_and_run(connection)
    else:
        asyncio.run(_run_async(CredentialSettings().CREDENTIAL_DATABASE_URL))


if context.is_offline_mode():
    run_offline()
else:
    run_online()
