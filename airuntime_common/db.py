"""Database engine helpers shared by job_service and credential_service.

* SQLite (aiosqlite) is the embedded default: WAL, a busy timeout, foreign keys.
* MySQL/MariaDB (aiomysql): READ COMMITTED, and ``CLIENT.FOUND_ROWS`` so an
  UPDATE's row count is rows *matched*, not rows changed (SPEC §3) — a
  same-microsecond heartbeat is never misread as a lost lease.
* :func:`retry_transient` retries deadlocks (1213) and lock wait timeouts
  (1205), and SQLite's "database is locked", invisibly (CONVENTIONS).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

MYSQL_TRANSIENT_ERRORS = frozenset({1213, 1205})


class DatabaseUnavailable(SystemExit):
    """A service's database could not be opened at start; exits with one line."""


@contextlib.asynccontextmanager
async def opening_database(prog: str, variable: str) -> AsyncIterator[None]:
    """Wrap a service's start: a database error inside (an unknown database, refused
    credentials, no server) stops the process with ``<prog>: refusing to start: the
    database of <variable> cannot be opened: <driver's message>`` instead of a
    traceback. The URL itself is not shown (it may hold a password).

    Raises:
        DatabaseUnavailable: for any :class:`DBAPIError` raised inside.
    """
    try:
        yield
    except DBAPIError as exc:
        raise DatabaseUnavailable(
            f"{prog}: refusing to start: the database of {variable} cannot be opened: {exc.orig}"
        ) from None


def is_mysql(url: str) -> bool:
    """Whether a SQLAlchemy URL points at MySQL/MariaDB."""
    return make_url(url).get_backend_name() in ("mysql", "mariadb")


def make_engine(
    url: str, *, pool_size: int = 20, ping_idle_seconds: float | None = None
) -> AsyncEngine:
    """Create the async engine for ``url`` with the settings above.

    Args:
        url: SQLAlchemy async URL, ``sqlite+aiosqlite:///…`` or ``mysql+aiomysql://…``.
        pool_size: connections kept open (MySQL only).
        ping_idle_seconds: MySQL only. None: ping every connection as it is checked
            out (SQLAlchemy's ``pool_pre_ping``). A number: ping only a connection
            idle in the pool at least this long (s); a busy connection goes out
            unpinged, saving a round trip per transaction. The caller must then
            survive a dead connection by retrying, e.g. with :func:`retry_transient`
            and :class:`DisconnectedBeforeCommit`.
    """
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url, connect_args={"timeout": 30})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if backend in ("mysql", "mariadb"):
        from pymysql.constants import CLIENT

        engine = create_async_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size,
            pool_pre_ping=ping_idle_seconds is None,
            pool_recycle=1800,
            pool_reset_on_return=None,  # see _reset_if_in_transaction
            isolation_level="READ COMMITTED",
            connect_args={
                "client_flag": CLIENT.FOUND_ROWS | CLIENT.MULTI_STATEMENTS,
                "charset": "utf8mb4",
            },
        )
        event.listen(engine.sync_engine, "reset", _reset_if_in_transaction)
        _skip_commit_after_batch(engine)
        if ping_idle_seconds is not None:
            _ping_when_idle(engine, ping_idle_seconds)
        return engine
    return create_async_engine(url)


def _ping_when_idle(engine: AsyncEngine, idle_seconds: float) -> None:
    """Pool listeners: stamp each check-in; ping a connection idle ``idle_seconds`` or more
    at check-out (a dead one is discarded and the pool hands out another)."""
    pool = engine.sync_engine.pool
    dialect = engine.sync_engine.dialect

    def checkin(_dbapi_conn: Any, record: Any) -> None:
        if record is not None:
            record.info["checked_in_at"] = time.monotonic()

    def checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        stamp = record.info.get("checked_in_at")
        if stamp is None or time.monotonic() - stamp < idle_seconds:
            return
        try:
            alive = dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError("idle connection failed its ping") from exc
        if not alive:
            raise DisconnectionError("idle connection failed its ping")

    event.listen(pool, "checkin", checkin)
    event.listen(pool, "checkout", checkout)


class DisconnectedBeforeCommit(Exception):
    """A transaction's connection died before its COMMIT was sent.

    The server rolled the transaction back, so running it again is safe;
    :func:`retry_transient` does. (A connection lost *during* COMMIT is not
    this: whether it committed is unknown, so that error is not retried. The
    exception is a multi-statement batch ending in COMMIT
    (:mod:`job_service.domain.batch`), lost before its answer: it is retried,
    and only transactions that converge when run again end a batch that way.)
    """

    def __init__(self, error: DBAPIError) -> None:
        super().__init__(str(error))
        self.error = error


def _in_transaction(dbapi_conn: Any) -> bool:
    """Whether the server says the connection is inside a transaction (True if unknown)."""
    status = getattr(getattr(dbapi_conn, "_connection", None), "get_transaction_status", None)
    if status is None:
        return True
    try:
        return bool(status())
    except Exception:  # pragma: no cover - defensive: unknown driver state
        return True


#: Attribute set on a driver connection whose transaction a batch has committed.
_COMMITTED_FLAG = "_airt_committed_by_batch"


def mark_committed(driver_conn: Any) -> None:
    """Record that ``driver_conn``'s transaction was just committed outside SQLAlchemy.

    For a multi-statement batch ending in ``COMMIT`` (:mod:`job_service.domain.batch`):
    SQLAlchemy's own COMMIT at the end of the transaction block is then skipped,
    unless another statement ran on the connection in between (which opened a
    new transaction that does need it).
    """
    setattr(driver_conn, _COMMITTED_FLAG, True)


def clear_committed(driver_conn: Any) -> None:
    """Forget :func:`mark_committed` for ``driver_conn`` (its next COMMIT is sent)."""
    if getattr(driver_conn, _COMMITTED_FLAG, False):
        setattr(driver_conn, _COMMITTED_FLAG, False)


def _skip_commit_after_batch(engine: AsyncEngine) -> None:
    """Dialect COMMIT: nothing when :func:`mark_committed` stands; listeners clear it."""
    dialect = engine.sync_engine.dialect
    base_commit = dialect.do_commit

    def do_commit(dbapi_conn: Any) -> None:
        driver = getattr(dbapi_conn, "_connection", None)
        if getattr(driver, _COMMITTED_FLAG, False):
            setattr(driver, _COMMITTED_FLAG, False)
            return
        base_commit(dbapi_conn)

    def clear(conn: Any, *_args: Any) -> None:
        clear_committed(conn.connection.driver_connection)

    dialect.do_commit = do_commit  # type: ignore[method-assign,assignment]
    event.listen(engine.sync_engine, "before_cursor_execute", clear)


def _reset_if_in_transaction(dbapi_conn: Any, _record: Any, state: Any) -> None:
    """Pool reset on check-in: ROLLBACK only when a transaction is still open.

    SQLAlchemy's default resets every returned connection with a ROLLBACK, which
    after a COMMIT is one more round trip per transaction for nothing. The
    server's ``SERVER_STATUS_IN_TRANS`` flag (from the last OK packet) tells
    whether anything is left to roll back; connections being discarded are not
    reset at all.
    """
    # a flag left by a batch whose block then failed is not handed to the next user
    clear_committed(getattr(dbapi_conn, "_connection", None))
    if state.terminate_only or state.transaction_was_reset:
        return
    if _in_transaction(dbapi_conn):
        dbapi_conn.rollback()


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """One session per request/RPC, never shared between tasks."""
    return async_sessionmaker(engine, expire_on_commit=False)


def is_transient(exc: BaseException) -> bool:
    """Deadlock / lock wait timeout (MySQL) or a busy SQLite database."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        args = getattr(exc.orig, "args", ())
        if args and isinstance(args[0], int) and args[0] in MYSQL_TRANSIENT_ERRORS:
            return True
        if isinstance(exc, OperationalError) and "database is locked" in str(exc.orig):
            return True
    return False


async def retry_transient(fn: Callable[[], Awaitable[T]], *, attempts: int = 8) -> T:
    """Run ``fn`` (one whole transaction) again on a transient error, with jittered backoff.

    Raises:
        The last error when every attempt failed, or any non-transient error at once.
    """
    for attempt in range(1, attempts + 1):
        try:
            return await fn()
        except DisconnectedBeforeCommit as lost:
            if attempt == attempts:
                raise lost.error from None
            log.info(
                "connection lost before commit, retrying", extra={"fields": {"attempt": attempt}}
            )
            continue
        except DBAPIError as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            delay = min(0.5, 0.005 * 2**attempt) * (0.5 + random.random())
            log.info("transient database error, retrying", extra={"fields": {"attempt": attempt}})
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")
