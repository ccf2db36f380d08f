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
elsewhere (:mod:`job_service.store.cache`): each is compiled once per
shape and expanded once per set of IN-list lengths (SQLAlchemy's expansion,
kept as text with a placeholder per value), and its bound values are escaped
by the driver (``escape``), so no value is ever pasted into SQL text unescaped.

Two things keep a batch as safe as the statements sent one by one:

* :meth:`StatementBatch.fence` — a guard after a conditional UPDATE whose
  outcome the caller must know before anything later runs (a fencing check:
  the lease still held). The server evaluates it; when the UPDATE matched a
  number of rows other than one (or the count the fence was given: a group's
  UPDATE of several leased jobs), the fence fails with error 1242, the server
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

Single-row INSERTs queued with ``merge`` (:meth:`StatementBatch.add`: a group's
result rows, model-call logs and business rows) join the first of their shape as one
multi-row INSERT, unless the entry after one reads its row count: a group of eight
results sends about 2.5 fewer statements per job.

This is the MySQL/MariaDB executor of :class:`job_service.store.batch.StatementBatch`;
SQLite runs the same batches one statement at a time
(:class:`~job_service.store.batch.SequentialBatch`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiomysql
import asyncmy.cursors
import asyncmy.errors
import pymysql
from pymysql.constants.SERVER_STATUS import SERVER_STATUS_IN_TRANS
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql import Select

from airuntime_common.db import clear_committed, mark_committed
from job_service.store.batch import FenceBroken, Outcome, Queued, StatementBatch
from job_service.store.engine import GALERA

#: The fence: a no-op when the previous statement matched exactly the expected
#: number of rows (``{rows}``), else a scalar subquery of two rows, which the
#: server refuses with error 1242 (a plain statement cannot SIGNAL on MySQL). It
#: is evaluated by the server, after the previous statement and before the next,
#: so nothing after it runs.
FENCE_SQL = "SET @airt_fence = IF(ROW_COUNT() = {rows:d}, 1, (SELECT 1 UNION ALL SELECT 2))"
#: ER_SUBQUERY_NO_1_ROW: what a failed fence raises.
FENCE_ERROR = 1242


class _QuietCursor(aiomysql.Cursor):  # type: ignore[misc]
    """A cursor that leaves the server's warnings unread.

    aiomysql reads them after a result with warnings (a ``SHOW WARNINGS`` round
    trip) to raise them as Python warnings. In a batch they are expected
    outcomes, e.g. a duplicate an ``INSERT IGNORE`` skipped, whose row count
    already tells the caller.
    """

    async def _show_warnings(self, conn: Any) -> None:
        return None


class _QuietAsyncmyCursor(asyncmy.cursors.Cursor):
    """:class:`_QuietCursor` for asyncmy (which reads warnings the same way)."""

    async def _show_warnings(self, conn: Any) -> None:
        return None


#: The base error class of each driver a batch runs on (aiomysql raises PyMySQL's).
_DRIVER_ERRORS: tuple[type[Any], ...] = (pymysql.err.Error, asyncmy.errors.Error)


async def _quiet_cursor(driver: Any) -> Any:
    """A warnings-quiet cursor on an aiomysql or asyncmy connection."""
    if isinstance(driver, aiomysql.Connection):
        return await driver.cursor(_QuietCursor)
    return driver.cursor(_QuietAsyncmyCursor)


#: Renderings kept per statement shape: one per combination of its IN-list lengths.
MAX_RENDERINGS = 256


class _Slot:
    """Marks where a caller's value lands in an expanded statement (see :class:`_Rendering`)."""

    __slots__ = ("index", "name")

    def __init__(self, name: str, index: int | None) -> None:
        self.name = name
        self.index = index


@dataclass(frozen=True)
class _Rendering:
    """A statement expanded for one set of IN-list lengths: its text (``%s`` per
    value) and, per placeholder, where its value comes from — the caller's
    ``(name, index in the list or None)``, or a constant bound in the statement —
    with the type's bind processor."""

    text: str
    slots: tuple[tuple[str | None, int | None, Any, Callable[[Any], Any] | None], ...]
    #: where the VALUES tuple of a plain single-row ``INSERT … VALUES (…)`` starts in
    #: ``text`` (the rows of merged INSERTs join there); -1 for any other statement
    values_at: int = -1
    #: the statement reads the row count of the one before it (``ROW_COUNT()``)
    reads_row_count: bool = False

    def args(self, params: Mapping[str, Any]) -> list[Any]:
        out = []
        for name, index, constant, proc in self.slots:
            if name is None:
                value = constant
            elif index is None:
                value = params[name]
            else:
                value = params[name][index]
            out.append(proc(value) if proc is not None else value)
        return out


@dataclass
class _Compiled:
    expand: Callable[[Mapping[str, Any]], Any]  # params → ExpandedState
    bind_processors: dict[str, Callable[[Any], Any]]
    result_processors: tuple[Callable[[Any], Any] | None, ...] | None
    # expanding (IN-list) bind names; None: the text depends on values, never cached
    expanding: tuple[str, ...] | None = ()
    renderings: dict[tuple[int, ...], _Rendering] = field(default_factory=dict)

    def rendering(self, params: Mapping[str, Any]) -> _Rendering | None:
        """The statement expanded for ``params``' IN-list lengths (made once per
        lengths, from SQLAlchemy's own expansion), or None to expand it per call."""
        if self.expanding is None:
            return None
        lists = [params.get(name) for name in self.expanding]
        if not all(isinstance(v, list | tuple) for v in lists):
            return None
        shape = tuple(len(v) for v in lists)  # type: ignore[arg-type]
        found = self.renderings.get(shape)
        if found is not None:
            return found
        if len(self.renderings) >= MAX_RENDERINGS:
            return None  # no room to keep one: SQLAlchemy's expansion, per call
        if any(isinstance(x, tuple) for v in lists for x in v):  # type: ignore[union-attr]
            return None  # tuple IN: several values per item
        marked: dict[str, Any] = {
            name: (
                [_Slot(name, i) for i in range(len(value))]
                if name in self.expanding
                else _Slot(name, None)
            )
            for name, value in params.items()
        }
        state = self.expand(marked)
        procs = {**self.bind_processors, **state.processors}
        slots: list[tuple[str | None, int | None, Any, Callable[[Any], Any] | None]] = []
        for position in state.positiontup:
            value = state.parameters[position]
            proc = procs.get(position)
            if isinstance(value, _Slot):
                slots.append((value.name, value.index, None, proc))
            else:
                slots.append((None, None, value, proc))
        text = state.statement
        made = self.renderings[shape] = _Rendering(
            text, tuple(slots), _values_at(text), "ROW_COUNT()" in text
        )
        return made


def _values_at(text: str) -> int:
    """Where the one VALUES tuple of a single-row ``INSERT [IGNORE] INTO t (…) VALUES (…)``
    starts in ``text``, or -1 (not an INSERT, several tuples, an upsert's clause after
    it, a SELECT as its source)."""
    marker = " VALUES ("
    at = text.find(marker)
    if not text.startswith("INSERT ") or at < 0 or text.find(marker, at + 1) >= 0:
        return -1
    start = at + len(" VALUES ")
    values = text[start:]
    if "'" in values or '"' in values or "`" in values:
        return -1  # literal text: parentheses are not counted in it
    depth = 0
    for i, ch in enumerate(values):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                # the tuple closes here: it must be the end of the statement
                return start if i == len(values) - 1 else -1
    return -1


_COMPILED: dict[Hashable, _Compiled] = {}


def _render(c: _Compiled, params: Mapping[str, Any], escape: Callable[[Any], str]) -> str:
    """One statement's SQL text with ``params`` escaped by the driver (``escape``):
    from its :class:`_Rendering` for these IN-list lengths when it has one, else
    as :func:`_render_expanded` makes it (the same text)."""
    rendering = c.rendering(params)
    if rendering is None:
        return _render_expanded(c, params, escape)
    return rendering.text % tuple(escape(v) for v in rendering.args(params))


def _render_rows(c: _Compiled, rows: list[Mapping[str, Any]], escape: Callable[[Any], str]) -> str:
    """One multi-row INSERT of merged single-row INSERTs of one shape (:func:`_merging`
    checked that their rendering has a VALUES tuple): the first's text, then each other
    row's tuple, in order."""
    rendering = c.rendering(rows[0])
    assert rendering is not None and rendering.values_at > 0
    at = rendering.values_at
    head, values = rendering.text[:at], rendering.text[at:]
    return head + ", ".join(values % tuple(escape(v) for v in rendering.args(row)) for row in rows)


def _merging(c: _Compiled, params: Mapping[str, Any]) -> bool:
    """Whether a statement queued with ``merge`` can join others of its shape: a kept
    rendering that is a plain single-row INSERT."""
    rendering = c.rendering(params)
    return rendering is not None and rendering.values_at > 0


def _render_expanded(c: _Compiled, params: Mapping[str, Any], escape: Callable[[Any], str]) -> str:
    """SQLAlchemy's own expansion of the bound values (IN lists and the statement's
    constants included), then the driver's escaping: per call, about three times
    the work of a kept :class:`_Rendering`."""
    state = c.expand(params)
    procs = {**c.bind_processors, **state.processors}
    args = tuple(
        escape(procs[n](v) if n in procs else v)
        for n, v in zip(state.positiontup, state.positional_parameters, strict=True)
    )
    return str(state.statement % args)


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
    # the caller's IN lists; one built into the shape (``status.in_([...])``) has
    # the same length on every call, and its values land in the kept text as constants
    given = set(column_keys)
    expanding: tuple[str, ...] | None = tuple(
        sorted(b.key for b in compiled.binds.values() if b.expanding and b.key in given)
    )
    if compiled.literal_execute_params or any(
        not b.expanding for b in compiled.post_compile_params
    ):
        expanding = None  # values rendered into the text: expanded per call
    return _Compiled(
        expand=compiled.construct_expanded_state,
        bind_processors=processors,
        result_processors=result,
        expanding=expanding,
    )


@dataclass(frozen=True)
class _Item:
    compiled: _Compiled | None  # None: a literal statement (fence, COMMIT)
    params: Mapping[str, Any]
    text: str = ""
    fence: str | None = None
    fence_rows: int = 1
    # merged INSERTs: every row's values, ``params`` first (empty: not merged)
    rows: list[Mapping[str, Any]] = field(default_factory=list)


def _compiled(
    dialect: Dialect, key: Hashable | None, stmt: Any, params: Mapping[str, Any]
) -> _Compiled:
    """The compiled form of one queued statement (kept per key and parameter names)."""
    if key is None:
        return _compile(dialect, stmt(), list(params))
    ckey = (key, dialect.name, tuple(params))
    found = _COMPILED.get(ckey)
    if found is None:
        found = _COMPILED[ckey] = _compile(dialect, stmt(), list(params))
    return found


class MultiStatementBatch(StatementBatch):
    """A :class:`~job_service.store.batch.StatementBatch` sent to MySQL/MariaDB as one
    multi-statement query: one round trip (module doc).

    Raises:
        ValueError: (at :meth:`run`) a statement needs Python-side column defaults
            (they cannot be rendered ahead of execution).
    """

    async def _connection(self) -> AsyncConnection:
        if isinstance(self._db, AsyncSession):
            return await self._db.connection()
        return self._db

    async def _execute(self, queue: list[Queued]) -> list[Outcome]:
        conn = await self._connection()
        # On a Galera node the COMMIT goes alone: a write set from another node can
        # abort the transaction while the batch runs, and the server then runs the
        # statements after the abort in a new transaction that the batch's COMMIT
        # would commit (MariaDB 10.11; reference §9.6). The 1213 of the abort is raised at
        # that COMMIT, and the caller's block rolls the leftover back.
        items, indexes = _items(conn.dialect, queue, galera=bool(conn.info.get(GALERA)))
        if not items:
            return []
        raw = await conn.get_raw_connection()
        driver: Any = raw.driver_connection
        clear_committed(driver)  # this transaction's COMMIT is to be sent unless we send it
        escape = driver.escape
        texts = [
            item.text
            if item.compiled is None
            else _render_rows(item.compiled, item.rows, escape)
            if len(item.rows) > 1
            else _render(item.compiled, item.params, escape)
            for item in items
        ]
        results = await _send(conn, raw, driver, items, texts)
        if items[-1].text == "COMMIT":
            mark_committed(driver)
            # The server has committed: no transaction is open. asyncmy keeps the
            # status of the batch's previous result when the last one reports
            # none (0), which would cost the pool's check-in a ROLLBACK round trip
            # (airuntime_common.db._reset_if_in_transaction).
            driver.server_status &= ~SERVER_STATUS_IN_TRANS
        return [results[i] for i in indexes]


def _items(dialect: Dialect, queue: list[Queued], *, galera: bool) -> tuple[list[_Item], list[int]]:
    """The batch's entries as the texts to send: each statement compiled (merged
    single-row INSERTs of one shape as one item), each fence its SQL, the COMMIT
    (left out on Galera); and, per statement, the position of its item."""
    items: list[_Item] = []
    indexes: list[int] = []  # statement number → position in ``items``
    merged: dict[int, int] = {}  # id of a merged shape → its item's position
    shapes = [
        None if e.sql is None else _compiled(dialect, e.sql.key, e.sql.statement, e.sql.params)
        for e in queue
    ]
    for n, entry in enumerate(queue):
        compiled = shapes[n]
        if entry.fence is not None:
            text = FENCE_SQL.format(rows=entry.fence_rows)
            items.append(_Item(None, {}, text, fence=entry.fence, fence_rows=entry.fence_rows))
        elif entry.sql is None or compiled is None:
            if not galera:
                items.append(_Item(None, {}, "COMMIT"))
        elif (
            entry.merge
            and _merging(compiled, entry.sql.params)
            and not _reads_row_count(queue, shapes, n + 1)
        ):
            at = merged.get(id(compiled))
            if at is None:
                at = merged[id(compiled)] = len(items)
                items.append(_Item(compiled, entry.sql.params))
            items[at].rows.append(entry.sql.params)
            indexes.append(at)
        else:
            indexes.append(len(items))
            items.append(_Item(compiled, entry.sql.params))
    return items, indexes


async def _send(
    conn: AsyncConnection, raw: Any, driver: Any, items: list[_Item], texts: list[str]
) -> list[Outcome]:
    """Send ``texts`` as one multi-statement query; one outcome per item.

    Raises:
        FenceBroken: a fence stopped the batch.
        sqlalchemy.exc.DBAPIError: a statement's error (the rest not run), or a lost
            connection (``connection_invalidated``; the pool forgets it).
    """
    dialect = conn.dialect
    results: list[Outcome] = []
    cursor = await _quiet_cursor(driver)
    try:
        await cursor.execute(";\n".join(texts))
        results.append(await _collect(cursor, items[0]))
        while await cursor.nextset():
            results.append(await _collect(cursor, items[len(results)]))
    except _DRIVER_ERRORS as exc:
        at = len(results)  # the server stopped at the statement that failed
        failed = items[at] if at < len(items) else None
        if failed is not None and failed.fence is not None and exc.args[:1] == (FENCE_ERROR,):
            raise FenceBroken(failed.fence, failed.fence_rows) from None
        disconnect = dialect.is_disconnect(exc, raw, cursor)
        if disconnect:
            # as SQLAlchemy does for its own statements: the pool forgets
            # every connection opened before this one (a restarted server
            # dropped them all), then this connection is discarded
            conn.sync_engine.pool._invalidate(raw, exc)
            await conn.invalidate(exc)
        # the statement, not the whole batch: its values may be large user data
        where = f"statement {at + 1} of {len(texts)} of a batch: " if failed else "a batch: "
        shown = texts[at] if failed is not None else texts[-1]
        raise DBAPIError.instance(
            where + (shown if len(shown) <= 300 else shown[:300] + " …"),
            None,
            exc,
            next(base for base in _DRIVER_ERRORS if isinstance(exc, base)),
            connection_invalidated=disconnect,
            dialect=dialect,
        ) from exc
    finally:
        await cursor.close()
    return results


def _reads_row_count(queue: list[Queued], shapes: list[_Compiled | None], n: int) -> bool:
    """Whether queue entry ``n`` (the one after a statement queued with ``merge``; its
    compiled form ``shapes[n]``) reads that statement's row count: a fence, or a
    statement using ``ROW_COUNT()`` (or one whose text is only made per call, so
    cannot be looked at)."""
    if n >= len(queue):
        return False
    entry, compiled = queue[n], shapes[n]
    if entry.fence is not None:
        return True
    if entry.sql is None or compiled is None:
        return False  # the COMMIT
    rendering = compiled.rendering(entry.sql.params)
    return rendering is None or rendering.reads_row_count


async def _collect(cursor: Any, item: _Item) -> Outcome:
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
