"""Transactions on the job database: one short transaction per operation, retried.

Every state change is one transaction (reference §2.3): :meth:`Store.tx` (an ORM
session, for code that uses the ORM) and :meth:`Store.lean_tx` (a bare
connection, for the runtime hot path, whose SQL is Core) both retry deadlocks,
lock wait timeouts and a connection that died before its COMMIT
(:func:`airuntime_common.db.retry_transient`), and on SQLite queue this
process's writers behind one asyncio lock and begin with ``BEGIN IMMEDIATE``
(:mod:`job_service.store.engine`). Reads use :meth:`Store.read` (no write lock)
or a plain session from ``Store.sessions``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker

from airuntime_common.db import DisconnectedBeforeCommit, retry_transient
from job_service.store.clock import DbClock
from job_service.store.engine import WRITE_TX, DbExec

T = TypeVar("T")


class Store:
    """The job database as the services use it.

    Args:
        sessions: the job database's session factory (its engine is the store's).
        clock: the database clock of that engine's dialect.
    """

    def __init__(self, sessions: async_sessionmaker[AsyncSession], clock: DbClock) -> None:
        self.sessions = sessions
        self.engine: AsyncEngine = sessions.kw["bind"]
        self.clock = clock
        #: SQLite has one writer: queue this process's write transactions here.
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if clock.is_sqlite else None

    async def tx(self, fn: Callable[[AsyncSession], Awaitable[T]]) -> T:
        """Run ``fn`` in one write transaction on a session, retried on transient errors
        (deadlock, lock wait timeout, a connection that died before COMMIT)."""

        async def run() -> T:
            async with self.sessions() as session, session.begin():
                return await _body(fn, session)

        return await self._write(run)

    async def lean_tx(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """:meth:`tx` on a bare connection: the same transaction, retries and SQLite
        write queue, without the ORM session's bookkeeping (about a quarter of a
        millisecond per transaction)."""

        async def run() -> T:
            async with self.engine.begin() as conn:
                return await _body(fn, conn)

        return await self._write(run)

    async def read(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run the read-only ``fn`` in one deferred transaction on a bare connection,
        retried on transient errors (readers never queue behind writers)."""

        async def run() -> T:
            async with self.engine.begin() as conn:
                return await _body(fn, conn)

        return await retry_transient(run)

    async def _write(self, run: Callable[[], Awaitable[T]]) -> T:
        async def once() -> T:
            token = WRITE_TX.set(True)
            try:
                if self._write_lock is None:
                    return await run()
                async with self._write_lock:
                    return await run()
            finally:
                WRITE_TX.reset(token)

        return await retry_transient(once)


async def _body(fn: Callable[[Any], Awaitable[T]], db: DbExec) -> T:
    try:
        return await fn(db)
    except DBAPIError as exc:
        # raised before COMMIT: the server rolled the transaction back
        if exc.connection_invalidated:
            raise DisconnectedBeforeCommit(exc) from exc
        raise
