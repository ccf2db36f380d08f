"""Helpers of the learning-data room: ids, times, idempotent inserts, running totals, owners."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import Table, func, select
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from airuntime_common.errors import AppError, ErrorCode, invalid_argument
from airuntime_common.timeutil import as_utc, utcnow
from job_service.store import cache
from job_service.store.cache import Sql
from job_service.store.engine import DbExec, dialect_name


def new_id() -> str:
    """A fresh opaque id (uuid4 hex, 32 characters)."""
    return uuid.uuid4().hex


def db_now() -> datetime:
    """Current UTC time, naive, as stored in the learning tables (not used for leases)."""
    return utcnow().replace(tzinfo=None)


def to_db_time(value: datetime) -> datetime:
    """Aware or naive-UTC datetime → naive UTC for storage."""
    return as_utc(value).replace(tzinfo=None)


async def insert_ignore(session: DbExec, table: Table, rows: list[dict[str, Any]]) -> int:
    """Insert ``rows`` into ``table``, silently skipping rows that hit a unique key.

    One statement: ``INSERT … ON CONFLICT DO NOTHING`` on SQLite/PostgreSQL,
    ``INSERT IGNORE`` on MySQL/MariaDB. Safe under concurrency: a concurrent
    insert of the same key waits on the key's lock and is then skipped.

    Args:
        session: the caller's session (transaction left open).
        table: the table; it must have a unique key over the dedupe columns.
        rows: the rows, validated beforehand (MySQL's IGNORE also hides other
            errors, so callers must not rely on the database to validate).

    Returns:
        How many rows were inserted (the others were duplicates).
    """
    if not rows:
        return 0
    dialect = dialect_name(session)
    if dialect not in ("sqlite", "mysql", "mariadb", "postgresql"):  # pragma: no cover
        raise AppError(ErrorCode.INTERNAL, f"unsupported database dialect {dialect}")
    # One shape per table, run with the rows as executemany parameters: the
    # driver sends them as one multi-row INSERT, and the statement compiles once
    # (a multi-VALUES ``insert().values(rows)`` has no cache key and compiles
    # on every call).
    key, build = ignore_statement(dialect, table)
    result: Any = await session.execute(cache.statement(key, build), rows)
    return int(result.rowcount)


def ignore_statement(dialect: str, table: Table) -> tuple[tuple[str, ...], Callable[[], Any]]:
    """:func:`insert_ignore`'s statement shape for ``table`` on ``dialect``: its
    statement-cache key and builder (bound: one row's columns by name)."""
    return ("insert_ignore", dialect, table.name), lambda: _ignore(dialect, table)


def insert_ignore_sql(dialect: str, table: Table, row: Mapping[str, Any]) -> Sql:
    """One row's :func:`insert_ignore` as an :class:`Sql` for a batch (its row count: 1
    when inserted, 0 when a unique key skipped it)."""
    key, build = ignore_statement(dialect, table)
    return Sql(key, build, row)


def _ignore(dialect: str, table: Table) -> Any:
    if dialect == "sqlite":
        return sqlite_insert(table).on_conflict_do_nothing()
    if dialect == "postgresql":  # pragma: no cover - not a supported job database
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    return mysql_insert(table).prefix_with("IGNORE")


def adding_upsert(
    dialect: str,
    table: Table,
    *,
    keys: Sequence[str],
    add: Sequence[str] = (),
    latest: Sequence[str] = (),
    replace: Sequence[str] = (),
    values: Mapping[str, Any] | None = None,
) -> Any:
    """An INSERT of one row of a running total that, when the row of its ``keys``
    exists, adds to it under the row lock instead: ``add`` columns are summed,
    ``latest`` ones keep the greater value, ``replace`` ones take the new value.

    ``ON CONFLICT … DO UPDATE`` on SQLite, ``ON DUPLICATE KEY UPDATE`` on
    MySQL/MariaDB. Racing upserts of one row each see the other's committed
    total, so none is lost. ``values`` are fixed SQL values (e.g. the database
    clock); the rest are bound per call.
    """
    c = table.c
    stmt: Any
    greatest: Any
    if dialect == "sqlite":
        stmt = sqlite_insert(table).values(**(values or {}))
        new, greatest = stmt.excluded, func.max
    else:
        stmt = mysql_insert(table).values(**(values or {}))
        new, greatest = stmt.inserted, func.greatest
    changes = {
        **{name: c[name] + new[name] for name in add},
        **{name: greatest(c[name], new[name]) for name in latest},
        **{name: new[name] for name in replace},
    }
    if dialect == "sqlite":
        return stmt.on_conflict_do_update(index_elements=[c[k] for k in keys], set_=changes)
    return stmt.on_duplicate_key_update(**changes)


#: Longest user id the tables hold.
MAX_USER_ID_CHARS: Final = 128


def require_user(user_id: str) -> None:
    """Refuse an empty or over-long user id.

    Raises:
        AppError: ``INVALID_ARGUMENT`` naming ``userId``.
    """
    if not user_id or len(user_id) > MAX_USER_ID_CHARS:
        raise invalid_argument(
            f"userId is required (at most {MAX_USER_ID_CHARS} characters)", field="userId"
        )


async def user_rows(
    session: DbExec,
    id_col: Any,
    material_col: Any,
    user_col: Any,
    user_id: str,
    ids: Iterable[str],
) -> dict[str, str]:
    """``{id: material_id}`` of the given ids that are the user's."""
    wanted = list(ids)
    if not wanted:
        return {}
    result = await session.execute(
        select(id_col, material_col).where(id_col.in_(wanted), user_col == user_id)
    )
    return {str(r[0]): str(r[1]) for r in result}
