"""Database engine helpers shared by job_service and credential_service.

* SQLite (aiosqlite) is the embedded default: WAL, a busy timeout, foreign keys.
* MySQL/MariaDB (asyncmy or aiomysql): READ COMMITTED, and ``CLIENT.FOUND_ROWS`` so an
  UPDATE's row count is rows *matched*, not rows changed (reference §3) — a
  same-microsecond heartbeat is never misread as a lost lease.
* :func:`retry_transient` retries deadlocks (1213) and lock wait timeouts
  (1205), and SQLite's "database is locked", invisibly (CONVENTIONS). On a
  MariaDB Galera cluster a write set that fails certification at COMMIT (a
  conflicting write committed on another node first), or a transaction aborted
  by a replicated one, is reported as the same 1213 and retried the same way.
* Galera (reference §9.6): :func:`migration_lock` takes a cluster-wide lock there
  (``GET_LOCK`` is local to one node and not replicated), and a node that is not
  in the Primary component (error 1047) counts as a lost connection, so the pool
  drops it and the next attempt reconnects (through HAProxy: to the next writer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import bindparam, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from airuntime_common.galera_lock import (
    GALERA_LOCK_LEASE_SECONDS,
    WSREP_NOT_READY,
    GaleraLock,
    pymysql_connector,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

MYSQL_TRANSIENT_ERRORS = frozenset({1213, 1205})


class DatabaseUnavailable(SystemExit):
    """A service's database could not be opened at start; exits with one line."""


class UnsafeDatabaseTopology(RuntimeError):
    """The database is reached in a way the services cannot run on safely (reference §9.6):
    a Galera node written to directly (:func:`check_single_writer`). The message
    completes ``<prog>: refusing to start: <variable> …``."""


#: Set to ``true`` to let a service write straight to one node of a Galera cluster
#: (a single writer that knows it is the only one; see :func:`check_single_writer`).
GALERA_ALLOW_DIRECT_NODE = "GALERA_ALLOW_DIRECT_NODE"


@contextlib.asynccontextmanager
async def opening_database(prog: str, variable: str) -> AsyncIterator[None]:
    """Wrap a service's start: a database error inside (an unknown database, refused
    credentials, no server) stops the process with ``<prog>: refusing to start: the
    database of <variable> cannot be opened: <driver's message>`` instead of a
    traceback, and so does a topology it cannot run on (:class:`UnsafeDatabaseTopology`:
    ``<prog>: refusing to start: <variable> <why>``). The URL itself is not shown (it
    may hold a password).

    Raises:
        DatabaseUnavailable: for any :class:`DBAPIError` or
            :class:`UnsafeDatabaseTopology` raised inside.
    """
    try:
        yield
    except DBAPIError as exc:
        raise DatabaseUnavailable(
            f"{prog}: refusing to start: the database of {variable} cannot be opened: {exc.orig}"
        ) from None
    except UnsafeDatabaseTopology as exc:
        raise DatabaseUnavailable(f"{prog}: refusing to start: {variable} {exc}") from None


def binary_collation(dialect: Any) -> str:
    """The MySQL/MariaDB collation of every identifier and text column: binary and
    NO PAD, so ``'u1'``, ``'U1'``, ``'ü1'`` and ``'u1 '`` are four different user ids
    (and ``😀`` and ``😁`` two different event ids), as on SQLite. The servers' default
    ``utf8mb4_general_ci`` folds case, accents and trailing spaces, which would let
    one user's id match another's rows and one instance's id pass another's fencing.

    Args:
        dialect: a connected MySQL/MariaDB dialect (``is_mariadb`` is known then).

    Returns:
        ``utf8mb4_nopad_bin`` on MariaDB, ``utf8mb4_0900_bin`` on MySQL 8.
    """
    return "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


def collate_binary_on_create(metadata: Any) -> None:
    """Tables that ``metadata.create_all`` makes on MySQL/MariaDB get
    :func:`binary_collation` as their default (migrations do the same with
    :func:`convert_to_binary_collation`); other dialects are untouched."""

    @event.listens_for(metadata, "before_create")
    def _binary(target: Any, connection: Any, **kw: Any) -> None:
        name = connection.dialect.name
        if name not in ("mysql", "mariadb"):
            return
        collation = binary_collation(connection.dialect)
        for table in kw.get("tables") or target.tables.values():
            table.dialect_kwargs[f"{name}_charset"] = "utf8mb4"
            table.dialect_kwargs[f"{name}_collate"] = collation


#: Column types whose collation :func:`convert_to_binary_collation` changes (the JSON
#: columns are LONGTEXT with ``utf8mb4_bin`` already and are never compared).
_TEXT_TYPES = ("char", "varchar", "tinytext", "text", "mediumtext")


def convert_to_binary_collation(conn: Any) -> list[str]:
    """Migration step: give every table of the connected MySQL/MariaDB schema the
    :func:`binary_collation` as its default, and every utf8mb4 text column of
    :data:`_TEXT_TYPES` that collation (its type, nullability and default kept; other
    character sets, such as the credentials' ``ascii_bin`` base64, are left alone),
    and the database itself, where the user may alter it, for tables made later.
    Idempotent: a column already converted is not selected again, so a run cut
    short (MySQL DDL is not transactional) is finished by the next. No-op on other
    dialects. Returns the statements run.
    """
    if conn.dialect.name not in ("mysql", "mariadb"):
        return []
    collation = binary_collation(conn.dialect)
    tables = [
        str(r[0])
        for r in conn.execute(
            text(
                "SELECT TABLE_NAME FROM information_schema.TABLES"
                " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE'"
                " ORDER BY TABLE_NAME"
            )
        )
    ]
    columns: dict[str, list[str]] = {}
    for table, column, column_type, nullable, default in conn.execute(
        text(
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT"
            " FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()"
            " AND CHARACTER_SET_NAME = 'utf8mb4' AND COLLATION_NAME <> :collation"
            " AND DATA_TYPE IN :types ORDER BY TABLE_NAME, ORDINAL_POSITION"
        ).bindparams(bindparam("types", expanding=True)),
        {"collation": collation, "types": list(_TEXT_TYPES)},
    ):
        spec = f"MODIFY `{column}` {column_type} CHARACTER SET utf8mb4 COLLATE {collation}"
        spec += " NULL" if nullable == "YES" else " NOT NULL"
        if default is not None and str(default).upper() != "NULL":
            spec += f" DEFAULT {default}"
        columns.setdefault(str(table), []).append(spec)
    # The server refuses to change a column a foreign key uses (1833, even with the
    # checks off): the foreign keys are dropped first and made again after, as they were.
    keys = _foreign_keys(conn) if columns else {}
    statements = [f"ALTER TABLE `{table}` DROP FOREIGN KEY `{name}`" for table, name in keys]
    statements += [
        f"ALTER TABLE `{table}` "
        + ", ".join([f"DEFAULT CHARACTER SET utf8mb4 COLLATE {collation}", *columns.get(table, [])])
        for table in tables
    ]
    statements += [
        f"ALTER TABLE `{table}` ADD CONSTRAINT `{name}` FOREIGN KEY ({', '.join(k['cols'])})"
        f" REFERENCES `{k['ref']}` ({', '.join(k['refs'])})"
        f" ON DELETE {k['delete']} ON UPDATE {k['update']}"
        for (table, name), k in keys.items()
    ]
    for statement in statements:
        conn.execute(text(statement))
    database = f"ALTER DATABASE CHARACTER SET utf8mb4 COLLATE {collation}"
    try:  # tables a later migration creates then take the collation too
        conn.execute(text(database))
    except DBAPIError:  # no ALTER privilege on the database itself: the tables count
        log.warning("cannot set the database's default collation; its tables are converted")
    else:
        statements.append(database)
    return statements


def _foreign_keys(conn: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The connected schema's foreign keys: ``(table, name)`` → referenced table,
    update/delete rules and the quoted columns on both sides, in key order."""
    keys: dict[tuple[str, str], dict[str, Any]] = {}
    for name, table, ref_table, on_update, on_delete, column, ref_column in conn.execute(
        text(
            "SELECT r.CONSTRAINT_NAME, r.TABLE_NAME, r.REFERENCED_TABLE_NAME, r.UPDATE_RULE,"
            " r.DELETE_RULE, k.COLUMN_NAME, k.REFERENCED_COLUMN_NAME"
            " FROM information_schema.REFERENTIAL_CONSTRAINTS r"
            " JOIN information_schema.KEY_COLUMN_USAGE k"
            " ON k.CONSTRAINT_SCHEMA = r.CONSTRAINT_SCHEMA AND k.TABLE_NAME = r.TABLE_NAME"
            " AND k.CONSTRAINT_NAME = r.CONSTRAINT_NAME"
            " WHERE r.CONSTRAINT_SCHEMA = DATABASE()"
            " ORDER BY r.TABLE_NAME, r.CONSTRAINT_NAME, k.ORDINAL_POSITION"
        )
    ):
        key = keys.setdefault(
            (str(table), str(name)),
            {"ref": ref_table, "update": on_update, "delete": on_delete, "cols": [], "refs": []},
        )
        key["cols"].append(f"`{column}`")
        key["refs"].append(f"`{ref_column}`")
    return keys


def is_mysql(url: str) -> bool:
    """Whether a SQLAlchemy URL points at MySQL/MariaDB."""
    return make_url(url).get_backend_name() in ("mysql", "mariadb")


#: Seconds a migration waits for another process's migration of the same schema.
MIGRATION_LOCK_TIMEOUT_SECONDS = 300


def wsrep_on(connection: Any) -> bool:
    """Whether a sync MySQL/MariaDB ``Connection`` is on a Galera node replicating
    writes (``wsrep_on = ON``); False on MySQL and on a MariaDB without Galera."""
    row = connection.execute(text("SHOW VARIABLES LIKE 'wsrep_on'")).first()
    return row is not None and str(row[1]).upper() == "ON"


def parse_addresses(value: str) -> set[tuple[str, int]]:
    """``wsrep_incoming_addresses`` (``host:port,[v6]:port,…``) as ``{(host, port)}``;
    entries without a port (``AUTO``, empty) are left out."""
    out: set[tuple[str, int]] = set()
    for item in value.split(","):
        host, sep, port = item.strip().rpartition(":")
        if sep and port.isdigit() and host:
            out.add((host.strip("[]"), int(port)))
    return out


def _endpoint_addresses(host: str | None, port: int) -> set[tuple[str, int]]:
    """Every IP address ``host`` resolves to, with ``port`` (empty when it does not)."""
    if not host:
        return set()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return set()
    return {(str(info[4][0]), port) for info in infos}


def check_single_writer(connection: Any, env: Mapping[str, str] | None = None) -> None:
    """Refuse a Galera node that this connection reaches directly (reference §9.6).

    Galera lets every node take writes, but the services rely on locks that stay
    on one node: ``SELECT … FOR UPDATE`` of the admission row that orders a
    user's creates against a revoke, and a multi-statement batch ending in
    ``COMMIT`` that a write set from another node can abort half-way (the
    statements after the abort then commit on their own). Replicas writing to
    different nodes at once let jobs slip past a revoke and can commit a job's
    success without its result (see docs/operations/databases.md). So a service connects through a
    single-writer proxy (HAProxy: one server, the others ``backup``); an endpoint
    that is one of the cluster's own client addresses (``wsrep_incoming_addresses``)
    of a cluster of two or more nodes is refused, unless
    :data:`GALERA_ALLOW_DIRECT_NODE` is ``true`` (a single writer by construction).
    Nothing is checked off Galera.

    Args:
        connection: a sync SQLAlchemy ``Connection``.
        env: the environment (default: ``os.environ``).

    Raises:
        UnsafeDatabaseTopology: the endpoint is a node of a multi-node cluster.
    """
    if connection.dialect.name not in ("mysql", "mariadb") or not wsrep_on(connection):
        return
    if (env if env is not None else os.environ).get(
        GALERA_ALLOW_DIRECT_NODE, ""
    ).strip().lower() in ("1", "true", "yes", "on"):
        return
    status = {
        str(k): str(v)
        for k, v in connection.execute(
            text(
                "SHOW STATUS WHERE Variable_name IN"
                " ('wsrep_cluster_size', 'wsrep_incoming_addresses')"
            )
        )
    }
    name = connection.execute(text("SELECT @@wsrep_node_name")).scalar()
    size = int(status.get("wsrep_cluster_size", "0") or 0)
    url = connection.engine.url
    endpoint = _endpoint_addresses(url.host, int(url.port or 3306))
    nodes = parse_addresses(status.get("wsrep_incoming_addresses", ""))
    direct = bool(endpoint & nodes) or (not url.host and "unix_socket" in url.query)
    if size >= 2 and direct:
        raise UnsafeDatabaseTopology(
            f"points straight at Galera node {name!r} of a {size}-node cluster: replicas"
            " writing to different nodes at once are not safe (reference §9.6). Connect"
            " through a single-writer proxy (HAProxy with one server and the others"
            f" 'backup'), or set {GALERA_ALLOW_DIRECT_NODE}=true if this process is the"
            " only writer."
        )


@contextlib.contextmanager
def migration_lock(
    connection: Any, name: str, timeout_s: float = MIGRATION_LOCK_TIMEOUT_SECONDS
) -> Iterator[None]:
    """Hold a server-wide (on Galera: cluster-wide) named lock around a schema migration.

    Replicas of a service that start together on one MySQL/MariaDB database each
    upgrade it at start; without the lock two would both create the first tables
    (``Table ... already exists``). With it the second waits, then finds the schema
    at head and does nothing. On SQLite (one file, one process) this does nothing.

    * MySQL / MariaDB: ``GET_LOCK`` on ``connection``'s session (it outlives the
      DDL's implicit commits, and the server frees it if the process dies).
    * MariaDB Galera (``wsrep_on``, reference §9.6): first :func:`check_single_writer`
      (every replica migrates at start, so a replica that would write to a node
      directly refuses to start here). ``GET_LOCK`` is local to one node,
      so two replicas writing to different nodes would both hold it. The lock is
      then a row of :data:`~airuntime_common.galera_lock.GALERA_LOCK_TABLE`, inserted by autocommit on a
      connection of its own: a commit is certified cluster-wide, so of two
      replicas inserting it on different nodes only one succeeds (the other sees
      1062 or a certification failure, 1213). The row is a lease of
      :data:`GALERA_LOCK_LEASE_SECONDS` renewed by a background thread; a waiter
      removes a lease that ran out (its holder died) and takes the lock.
      Lease times are ``NOW(6)`` of the nodes, whose clocks are kept in sync.

    What ran under the lock is committed before the lock is released (rolled back if
    the body raised), the caller's own transaction included: the next holder must see
    the version row the migration wrote, or it runs the migration again (its version
    UPDATE then matches 0 rows).

    Args:
        connection: a sync SQLAlchemy ``Connection`` (inside ``run_sync``).
        name: the lock's name (at most 64 characters).
        timeout_s: seconds to wait for another holder.

    Raises:
        TimeoutError: the lock was not free within ``timeout_s`` seconds.
        UnsafeDatabaseTopology: see :func:`check_single_writer`.
    """
    if connection.dialect.name not in ("mysql", "mariadb"):
        yield
        return
    # the lock is the session's, not the transaction's: a caller's transaction stays open
    # into the body (_settled ends it); one begun here only for the lock query ends at once
    outer = connection.in_transaction()
    galera = wsrep_on(connection)
    if galera:
        check_single_writer(connection)
        if not outer:
            connection.commit()
        lock = GaleraLock(pymysql_connector(connection), name, lease_s=GALERA_LOCK_LEASE_SECONDS)
        lock.acquire(timeout_s)
        try:
            with _settled(connection):
                yield
        finally:
            lock.release()
        return
    got = connection.execute(
        text("SELECT GET_LOCK(:name, :timeout)"), {"name": name, "timeout": int(timeout_s)}
    ).scalar()
    if not outer:
        connection.commit()
    if got != 1:
        raise TimeoutError(f"another process held the migration lock {name!r} for {timeout_s} s")
    try:
        with _settled(connection):
            yield
    finally:
        connection.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})
        connection.commit()


@contextlib.contextmanager
def _settled(connection: Any) -> Iterator[None]:
    """End ``connection``'s transaction when the block ends: commit, or roll back if it raised."""
    try:
        yield
    except BaseException:
        if connection.in_transaction():
            connection.rollback()
        raise
    if connection.in_transaction():
        connection.commit()


MYSQL_ASYNC_DRIVERS = ("mysql+aiomysql", "mysql+asyncmy")
#: A MySQL/MariaDB URL that names no driver runs on this one (compiled: less CPU).
DEFAULT_MYSQL_DRIVER = "asyncmy"


def mysql_async_driver(url: str) -> str:
    """The async driver name to use for a MySQL/MariaDB server given as ``url``.

    ``url``'s own driver when it is one of :data:`MYSQL_ASYNC_DRIVERS` (or their
    ``mariadb+`` spellings, returned as ``mysql+``), else ``mysql+aiomysql``: a
    test or benchmark URL such as ``mysql+aiomysql://root@host/x`` thereby picks
    the driver its databases are reached with. Raises ``ArgumentError`` on a
    string that is no URL.
    """
    name = make_url(url).drivername.replace("mariadb+", "mysql+")
    return name if name in MYSQL_ASYNC_DRIVERS else MYSQL_ASYNC_DRIVERS[0]


def make_engine(
    url: str, *, pool_size: int = 20, ping_idle_seconds: float | None = None
) -> AsyncEngine:
    """Create the async engine for ``url`` with the settings above.

    Args:
        url: SQLAlchemy async URL, ``sqlite+aiosqlite:///…``, ``mysql+asyncmy://…`` or
            ``mysql+aiomysql://…``; ``mysql://…`` (no driver) runs on asyncmy.
        pool_size: connections kept open (MySQL only).
        ping_idle_seconds: MySQL only. None: ping every connection as it is checked
            out (SQLAlchemy's ``pool_pre_ping``). A number: ping only a connection
            idle in the pool at least this long (s); a busy connection goes out
            unpinged, saving a round trip per transaction. The caller must then
            survive a dead connection by retrying, e.g. with :func:`retry_transient`
            and :class:`DisconnectedBeforeCommit`.
    """
    parsed = make_url(url)
    if parsed.drivername in ("mysql", "mariadb"):  # no driver named: the compiled one
        parsed = parsed.set(drivername=f"{parsed.drivername}+{DEFAULT_MYSQL_DRIVER}")
        url = parsed.render_as_string(hide_password=False)
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
        from pymysql.constants import CLIENT  # protocol flags: the same for both drivers

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
        event.listen(engine.sync_engine, "handle_error", _wsrep_not_ready_is_a_disconnect)
        _skip_commit_after_batch(engine)
        if ping_idle_seconds is not None:
            _ping_when_idle(engine, ping_idle_seconds)
        return engine
    return create_async_engine(url)


def _wsrep_not_ready_is_a_disconnect(context: Any) -> None:
    """``handle_error`` listener: a Galera node outside the Primary component (1047,
    :data:`WSREP_NOT_READY`) is treated as a lost connection. SQLAlchemy then
    invalidates it (and the pool's other connections, opened to the same node)
    instead of handing it out again, and the error carries ``connection_invalidated``,
    which callers retry as a transaction that did not commit
    (:class:`DisconnectedBeforeCommit`); the next connection goes through the proxy to
    a node that is synced (reference §9.6)."""
    args = getattr(context.original_exception, "args", ())
    if args and args[0] == WSREP_NOT_READY:
        context.is_disconnect = True


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
    (:mod:`job_service.store.mysql_batch`), lost before its answer: it is retried,
    and only transactions that converge when run again end a batch that way.)
    """

    def __init__(self, error: DBAPIError) -> None:
        super().__init__(str(error))
        self.error = error


async def before_commit(fn: Callable[[Any], Awaitable[T]], db: Any) -> T:
    """Await ``fn(db)`` inside a transaction whose COMMIT comes after it; a connection
    found dead meanwhile (``connection_invalidated``: a failover, a KILL, a node that
    left the cluster) is raised as :class:`DisconnectedBeforeCommit`, which
    :func:`retry_transient` runs again (the server rolled the transaction back).

    Raises:
        DisconnectedBeforeCommit: for a :class:`DBAPIError` with ``connection_invalidated``.
    """
    try:
        return await fn(db)
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise DisconnectedBeforeCommit(exc) from exc
        raise


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

    For a multi-statement batch ending in ``COMMIT`` (:mod:`job_service.store.mysql_batch`):
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


def _backoff(attempt: int) -> float:
    """Seconds before attempt ``attempt + 1``: 5 ms doubling, at most 0.5 s, jittered ±50 %."""
    return min(0.5, 0.005 * 2.0**attempt) * (0.5 + random.random())


async def retry_transient(fn: Callable[[], Awaitable[T]], *, attempts: int = 8) -> T:
    """Run ``fn`` (one whole transaction) again on a transient error, with jittered backoff.

    Transient: a deadlock or lock wait timeout (:func:`is_transient`; on Galera also a
    certification failure at COMMIT, which is reported as a deadlock), and a
    connection that died before COMMIT (:class:`DisconnectedBeforeCommit`). The
    first retry after a lost connection is at once (usually one stale pooled
    connection); later ones back off like the others, so a failover to another
    node (seconds) is waited for a while rather than met eight times in a row.

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
            if attempt > 1:
                await asyncio.sleep(_backoff(attempt))
        except DBAPIError as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            log.info("transient database error, retrying", extra={"fields": {"attempt": attempt}})
            await asyncio.sleep(_backoff(attempt))
    raise AssertionError("unreachable")
