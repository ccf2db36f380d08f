"""Several statements of one transaction in one round trip (MySQL/MariaDB).

The runtime hot path's transactions are short, and after their first read
most of what they write is already decided: SubmitResult's locking read has
checked the lease, so what follows (the invocation log, the result row, the
job's UPDATE, its event, the COMMIT) is decided by that read. Only the UPDATE's
outcome still matters, since the lease may lapse after the read, and a fence
checks it. Sent one by one these statements cost a round trip each, and in
the job service every round trip costs far more CPU (driver, event loop,
SQLAlchemy) than the server's work on it.

Batched: claim (lock UPDATE + events + read; its COMMIT is sent alone),
GetSnapshot's implied start with its event and snapshot read, the lease check
behind ResolveCredential (VerifyLease), and SubmitResult's writes after its
read. FailJob and everything off the hot path run one statement at a time.

:class:`StatementBatch` sends such a run of statements as one multi-statement
query (``CLIENT.MULTI_STATEMENTS``, set on every MySQL engine by
:func:`airuntime_common.db.make_engine`) and hands back each statement's row
count and rows. Statements are the same cached Core shapes the hot path runs
elsewhere (:mod:`job_service.domain.sqlcache`): each is compiled once per
shape, and its bound values are escaped by the driver (``mogrify``), so no
value is ever pasted into SQL text unescaped.

Two things keep a batch as safe as the statements sent one by one:

* :meth:`StatementBatch.fence` — a guard after a conditional UPDATE whose
  outcome the caller must know before anything later runs (a fencing check:
  the lease still held). The server evaluates it; when the UPDATE matched a
  number of rows other than one, the fence fails with error 1242, the server
  runs nothing after it (the COMMIT included) and :meth:`run` raises
  :class:`FenceBroken`; the caller's transaction then rolls back.
* An error anywhere stops the server at that statement, as it would stop a
  caller sending them one by one; it is raised as SQLAlchemy's
  :class:`~sqlalchemy.exc.DBAPIError` family, so deadlock retries
  (:func:`airuntime_common.db.retry_transient`) and integrity errors behave as
  for any other statement. A connection lost during a batch invalidates the
  connection and raises with ``connection_invalidated`` set, which the job
  domain retries: a batch ending in COMMIT may then have committed, so only
  transactions that converge when run again (a replayed result, an implied
  start that matches no row the second time) may end a batch with
  :meth:`StatementBatch.commit`. A claim does not: run again, it would lock
  other jobs, so its COMMIT is sent alone.

SQLite has no round trips to save (it runs in process), so batches are for
MySQL/MariaDB only: :func:`supports_batches` tells, and callers keep their
one-by-one path for SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import pymysql
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import Select

from airuntime_common.db import clear_committed, mark_committed
from job_service.db import DbExec
from job_service.domain import sqlcache

#: The fence: a no-op when the previous statement matched exactly one row, else
#: a scalar subquery of two rows, which the server refuses with error 1242 (a
#: plain statement cannot SIGNAL on MySQL). It is evaluated by the server, after
#: the previous statement and before the next, so nothing after it runs.
FENCE_SQL = "SET @airt_fence = IF(ROW_COUNT() = 1, 1, (SELECT 1 UNION ALL SELECT 2))"
#: ER_SUBQUERY_NO_1_ROW: what a failed fence raises.
FENCE_ERROR = 1242


def supports_batches(db: DbExec) -> bool:
    """Whether ``db`` can run a :class:`StatementBatch`: a bare connection to MySQL/MariaDB."""
    return isinstance(db, AsyncConnection) and db.dialect.name in ("mysql", "mariadb")


class FenceBroken(Exception):
    """A fenced statement matched no row (or several); the batch stopped at its fence.

    Nothing after the fence ran and nothing was committed; the transaction is
    still open and the caller's ``engine.begin()`` block rolls it back.

    Attributes:
        label: what :meth:`StatementBatch.fence` was given (e.g. ``"succeed"``).
    """

    def __init__(self, label: str) -> None:
        super().__init__(f"fenced statement {label!r} did not match exactly one row")
        self.label = label


@dataclass(frozen=True)
class Outcome:
    """One statement's result: ``rowcount`` (rows matched or returned) and its ``rows``.

    ``rows`` are plain tuples in the order of the statement's selected columns,
    with each column type's result processing applied (e.g. JSON decoded); empty
    for statements returning no rows.
    """

    rowcount: int
    rows: list[tuple[Any, ...]]


@dataclass(frozen=True)
class _Compiled:
    expand: Callable[[Mapping[str, Any]], Any]  # params → ExpandedState
    bind_processors: dict[str, Callable[[Any], Any]]
    result_processors: tuple[Callable[[Any], Any] | None, ...] | None


_COMPILED: dict[Hashable, _Compiled] = {}


def _compile(dialect: Dialect, stmt: Any, column_keys: list[str]) -> _Compiled:
    compiled = stmt.compile(dialect=dialect, column_keys=column_keys)
    if compiled.insert_prefetch or compiled.update_prefetch:
        raise ValueError("batched statements must not need Python-side column defaults")
    # the processors SQLAlchemy itself would apply: each type's dialect
    # implementation (variants and the dialect's type table included)
    processors: dict[str, Callable[[Any], Any]] = {}
    for name, bind in compiled.binds.items():
        proc = bind.type._cached_bind_processor(dialect)
        if proc is not None:
            processors[name] = proc
    result: tuple[Callable[[Any], Any] | None, ...] | None = None
    if isinstance(stmt, Select):
        result = tuple(
            col.type._cached_result_processor(dialect, None) for col in stmt.selected_columns
        )
    return _Compiled(
        expand=compiled.construct_expanded_state,
        bind_processors=processors,
        result_processors=result,
    )


@dataclass(frozen=True)
class _Item:
    compiled: _Compiled | None  # None: a literal statement (fence, COMMIT)
    params: Mapping[str, Any]
    text: str = ""
    fence: str | None = None


class StatementBatch:
    """Statements of one transaction, sent to MySQL/MariaDB in one round trip.

    Usage::

        batch = StatementBatch(conn)
        i = batch.add(("succeed", ...), build_update, params)
        batch.fence("succeed")          # stop here unless the UPDATE matched one row
        batch.add(("record_event", ...), build_event, event_params)
        batch.commit()
        outcomes = await batch.run()    # outcomes[i].rowcount == 1

    Args:
        db: a bare connection inside a transaction (``engine.begin()``), to
            MySQL/MariaDB (:func:`supports_batches`).

    Raises:
        ValueError: ``db`` cannot run batches.
    """

    def __init__(self, db: DbExec) -> None:
        if not supports_batches(db):
            raise ValueError("statement batches need a MySQL/MariaDB connection")
        assert isinstance(db, AsyncConnection)
        self._db = db
        self._dialect = db.dialect
        self._items: list[_Item] = []
        self._indexes: list[int] = []  # add() index → statement position

    def add(self, key: Hashable | None, build: Callable[[], Any], params: Mapping[str, Any]) -> int:
        """Queue one statement; returns its index in :meth:`run`'s outcomes.

        Args:
            key: the statement's :mod:`sqlcache` key (every fact its shape depends
                on, the dialect included), or None for a one-off statement
                (compiled for this call only).
            build: makes the statement (bound parameters for per-call values).
            params: this call's values by bind name (for an INSERT, its columns).

        Raises:
            ValueError: the statement needs Python-side column defaults (they
                cannot be rendered ahead of execution).
        """
        if key is None:
            compiled = _compile(self._dialect, build(), list(params))
        else:
            ckey = (key, self._dialect.name, tuple(params))
            compiled = _COMPILED.get(ckey)  # type: ignore[assignment]
            if compiled is None:
                stmt = sqlcache.statement(key, build)
                compiled = _COMPILED[ckey] = _compile(self._dialect, stmt, list(params))
        self._items.append(_Item(compiled, params))
        self._indexes.append(len(self._items) - 1)
        return len(self._indexes) - 1

    def fence(self, label: str) -> None:
        """Stop the batch unless the statement just queued matched exactly one row.

        Args:
            label: names the fenced statement in :class:`FenceBroken`.
        """
        self._items.append(_Item(None, {}, FENCE_SQL, fence=label))

    def commit(self) -> None:
        """End the batch with COMMIT (the transaction's own commit then sends nothing).

        Only for transactions that converge when run again: see the module doc.
        """
        self._items.append(_Item(None, {}, "COMMIT"))

    def _render(self, driver: Any) -> list[str]:
        texts: list[str] = []
        escape = driver.escape
        for item in self._items:
            c = item.compiled
            if c is None:
                texts.append(item.text)
                continue
            # SQLAlchemy's own expansion of the bound values (IN lists of a
            # shape's constant states included), then the driver's escaping
            state = c.expand(item.params)
            procs = {**c.bind_processors, **state.processors}
            values = state.positional_parameters
            args = tuple(
                escape(procs[n](v) if n in procs else v)
                for n, v in zip(state.positiontup, values, strict=True)
            )
            texts.append(state.statement % args)
        return texts

    async def run(self) -> list[Outcome]:
        """Send every queued statement in one round trip; one :class:`Outcome` per :meth:`add`.

        Raises:
            FenceBroken: a fence found its statement matched no row or several.
            sqlalchemy.exc.DBAPIError: any other error of a statement (the server
                ran nothing after it), or a lost connection (then
                ``connection_invalidated`` is set and the connection is discarded).
        """
        if not self._items:
            return []
        raw = await self._db.get_raw_connection()
        driver: Any = raw.driver_connection
        clear_committed(driver)  # this transaction's COMMIT is to be sent unless we send it
        texts = self._render(driver)
        results: list[Outcome] = []
        cursor = await driver.cursor()
        try:
            await cursor.execute(";\n".join(texts))
            results.append(await self._collect(cursor, 0))
            while await cursor.nextset():
                results.append(await self._collect(cursor, len(results)))
        except pymysql.err.Error as exc:
            at = len(results)  # the server stopped at the statement that failed
            failed = self._items[at] if at < len(self._items) else None
            if failed is not None and failed.fence is not None and exc.args[:1] == (FENCE_ERROR,):
                raise FenceBroken(failed.fence) from None
            disconnect = self._dialect.is_disconnect(exc, raw, cursor)
            if disconnect:
                # as SQLAlchemy does for its own statements: the pool forgets
                # every connection opened before this one (a restarted server
                # dropped them all), then this connection is discarded
                self._db.sync_engine.pool._invalidate(raw, exc)
                await self._db.invalidate(exc)
            # the statement, not the whole batch: its values may be large user data
            where = f"statement {at + 1} of {len(texts)} of a batch: " if failed else "a batch: "
            shown = texts[at] if failed is not None else texts[-1]
            raise DBAPIError.instance(
                where + (shown if len(shown) <= 300 else shown[:300] + " …"),
                None,
                exc,
                pymysql.err.Error,
                connection_invalidated=disconnect,
                dialect=self._dialect,
            ) from exc
        finally:
            await cursor.close()
        if self._items[-1].text == "COMMIT":
            mark_committed(driver)
        return [results[i] for i in self._indexes]

    async def _collect(self, cursor: Any, position: int) -> Outcome:
        item = self._items[position]
        if cursor.description is None:
            return Outcome(int(cursor.rowcount), [])
        rows = list(await cursor.fetchall())
        procs = item.compiled.result_processors if item.compiled is not None else None
        if procs and any(p is not None for p in procs):
            rows = [
                tuple(p(v) if p is not None else v for p, v in zip(procs, row, strict=True))
                for row in rows
            ]
        return Outcome(len(rows), rows)
