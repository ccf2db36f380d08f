"""job_service engine: the shared engine settings plus single-writer SQLite transactions.

On SQLite every write transaction starts with ``BEGIN IMMEDIATE`` so a
read-then-write transaction never fails on a lock upgrade (reads stay
deferred and, with WAL, never wait); inside one process writers also queue on
an asyncio lock instead of SQLite's sleeping busy handler, and across
processes the busy timeout queues them. MySQL/MariaDB keep READ COMMITTED and row locks.
"""

from __future__ import annotations

import contextvars
from typing import Any, TypeAlias

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from airuntime_common.db import make_engine

#: What the hot path's SQL runs on: a session, or a bare connection (cheaper per
#: transaction) inside a transaction. Both offer ``execute``.
DbExec: TypeAlias = AsyncSession | AsyncConnection


def dialect_name(db: DbExec) -> str:
    """The SQL dialect behind ``db`` (``"sqlite"``, ``"mysql"``, ``"mariadb"``)."""
    if isinstance(db, AsyncConnection):
        return db.dialect.name
    return db.get_bind().dialect.name


#: Set while a write transaction runs (see :meth:`job_service.store.tx.Store.tx`): SQLite then
#: begins with ``BEGIN IMMEDIATE``; plain reads use a deferred ``BEGIN``.
WRITE_TX: contextvars.ContextVar[bool] = contextvars.ContextVar("job_write_tx", default=False)


#: A pooled connection idle this long is pinged before use (s); busier ones are
#: not, and :meth:`job_service.store.tx.Store.tx` retries a transaction whose connection died
#: before its COMMIT (:class:`airuntime_common.db.DisconnectedBeforeCommit`).
IDLE_PING_SECONDS = 1.0


#: Key of a pooled connection's ``info``: its server is a Galera node (``wsrep_on``).
GALERA = "airt_galera"


def make_job_engine(url: str) -> AsyncEngine:
    """Engine for the job database (see module doc).

    On MySQL/MariaDB each new connection notes whether its server is a Galera node
    (:data:`GALERA` in the connection's ``info``): there a statement batch never
    carries its COMMIT (:mod:`job_service.store.mysql_batch`).
    """
    engine = make_engine(url, ping_idle_seconds=IDLE_PING_SECONDS)
    if engine.dialect.name in ("mysql", "mariadb"):

        @event.listens_for(engine.sync_engine, "connect")
        def _note_galera(dbapi_conn: Any, record: Any) -> None:
            cursor = dbapi_conn.cursor()
            try:
                cursor.execute("SHOW VARIABLES LIKE 'wsrep_on'")
                row = cursor.fetchone()
            finally:
                cursor.close()
            record.info[GALERA] = row is not None and str(row[1]).upper() == "ON"

    if engine.dialect.name == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _autocommit_driver(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None

        @event.listens_for(engine.sync_engine, "begin")
        def _begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if WRITE_TX.get() else "BEGIN")

    return engine
